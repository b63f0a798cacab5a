// torch/session_operators: the session's per-operator half — what happens in the observer's
// callbacks: which storages an operator uses, their ids, the executor's work before and after
// the operator, and how a failure inside a callback is carried to the training code.
#include <algorithm>

#include "host_syncs.hpp"
#include "op_views.hpp"
#include "op_writes.hpp"
#include "session.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::torch_binding {
namespace {

template <typename F>
void for_each_tensor(const c10::IValue& value, const F& f) {
  if (value.isTensor()) {
    f(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) f(t);
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) for_each_tensor(item, f);
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) for_each_tensor(item, f);
  }
}

// The storages of the tensors among `values` (an operator's inputs or outputs) that `keep`
// accepts.
template <typename Values, typename Keep>
std::vector<c10::Storage> storages_of(const Values& values, const Keep& keep) {
  std::vector<c10::Storage> out;
  for (const c10::IValue& value : values) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (keep(t)) out.push_back(t.storage());
    });
  }
  return out;
}

// The storages of the inputs the operator may write (op_writes), among those `keep` accepts.
template <typename Keep>
std::vector<c10::Storage> written_storages(const at::RecordFunction& fn, const Keep& keep) {
  const std::vector<bool>& mask = written_inputs(fn);
  const auto inputs = fn.inputs();
  std::vector<c10::Storage> out;
  for (std::size_t i = 0; i < inputs.size() && i < mask.size(); ++i) {
    if (!mask[i]) continue;
    for_each_tensor(inputs[i], [&](const at::Tensor& t) {
      if (keep(t)) out.push_back(t.storage());
    });
  }
  return out;
}

}  // namespace

bool Session::movable(const at::Tensor& tensor) const {
  return on_device(tensor) && tensor.storage().nbytes() >= config_.min_tensor_bytes;
}

bool Session::on_device(const at::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  const c10::Storage& storage = tensor.storage();
  const c10::Device device = storage.device();
  if (device.type() != device_.type()) return false;
  if (device_.is_cuda() && device.index() != device_.index()) return false;
  // Storages over foreign memory (from_blob, numpy, DLPack, shared memory) have no allocator:
  // they could not be given memory again once moved out.
  return storage.allocator() != nullptr;
}

void Session::untrack(c10::StorageImpl* impl, TensorId id, const std::vector<TensorId>& in_use) {
  if (executor_->contains(id)) {
    const std::vector<TensorId> one{id};
    executor_->fetch(one, in_use);
    executor_->remove_tensor(id);
  }
  memory_->hand_back_settled(*executor_);
  table_.erase(impl);
}

void Session::refresh_size(const c10::Storage& storage, TrackedStorage& entry) {
  if (storage.nbytes() != entry.bytes && storage.data() != nullptr &&
      executor_->location(entry.id) == runtime::Location::kDevice) {
    // Resized in place (an out= operator, resize_): the executor moves whole storages by size.
    executor_->remove_tensor(entry.id);
    executor_->add_tensor(entry.id, storage.nbytes());
    entry.bytes = storage.nbytes();
  }
}

TensorId Session::identify(const c10::Storage& storage, const FirstSight& sight,
                           const std::vector<TensorId>& in_use) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (TrackedStorage* entry = table_.find(impl)) {
    refresh_size(storage, *entry);
    return entry->id;
  }
  TensorId id = 0;
  if (phase_ == SessionPhase::kWarmup) {
    id = (1ull << 63) | warmup_ids_++;
  } else {
    id = tensor_id_for(sight);
    if (phase_ == SessionPhase::kPlanned && !diverged_) {
      const auto profiled = plan_bytes_.find(id);
      if (profiled == plan_bytes_.end()) {
        diverge(cat("operator ", sight.op, " created a storage the profile did not have"));
      } else if (profiled->second != storage.nbytes()) {
        diverge(cat("operator ", sight.op, " created a storage of ", storage.nbytes(),
                    " bytes, the profile had ", profiled->second, " (a different shape)"));
      }
    }
  }
  if (c10::StorageImpl* holder = table_.holder_of(id)) {
    if (table_.alive(id)) {
      // A storage from an earlier step still alive under the id this position gives (a loss
      // kept for logging): it leaves the session's care so the new one can take the id.
      untrack(holder, id, in_use);
    } else {
      executor_->remove_tensor(id);
      table_.erase(holder);
    }
  }
  table_.add(storage, id, step_index_);
  if (phase_ == SessionPhase::kProfile && in_step_ && config_.record_releases) {
    releases_.watch(id, storage.getWeakStorageImpl());
  }
  executor_->add_tensor(id, storage.nbytes());
  if (in_step_ && sight.output) {
    if (births_.bytes.size() <= sight.op) births_.bytes.resize(sight.op + 1, 0);
    births_.bytes[sight.op] += storage.nbytes();
    largest_birth_ = std::max(largest_birth_, births_.bytes[sight.op]);
    if (hole_) {  // only the hole asks for an operator's largest birth
      if (births_.largest.size() <= sight.op) births_.largest.resize(sight.op + 1, 0);
      births_.largest[sight.op] = std::max(births_.largest[sight.op], storage.nbytes());
      hole_->note_birth(sight.op, id, storage.nbytes());
    }
  }
  return id;
}

void Session::record_failure(std::exception_ptr error, const std::vector<TensorId>& used) {
  // RecordFunction swallows exceptions from callbacks and runs the operator anyway, and not
  // every kernel checks for an empty data pointer. So a storage that could not be fetched gets
  // zeroed scratch memory for this operator (its bytes stay valid in the tier, and the next
  // fetch replaces the scratch), the training code is stopped at its next Python statement,
  // and the step ends with this error. The error is kept first: giving scratch memory can fail
  // too (out of memory is a common cause of both), and then the operator fails on the missing
  // data with a message that would hide this one.
  if (!pending_error_) {
    pending_error_ = error;
    // Raised by the next callback, outside the session's lock: the interrupt takes the GIL,
    // which threads holding the GIL may be waiting to give up while they wait for this lock.
    interrupt_due_ = true;
  }
  for (const TensorId id : used) {
    c10::StorageImpl* impl = table_.find_id(id);
    if (impl != nullptr && table_.alive(id)) give_scratch(impl);
  }
}

std::vector<TensorId> Session::ids_of(const std::vector<c10::Storage>& storages) {
  std::vector<TensorId> ids;
  for (const auto& s : storages) {
    if (const TrackedStorage* entry = table_.find(s.unsafeGetStorageImpl())) ids.push_back(entry->id);
  }
  return ids;
}

void Session::forget_kept_copies(std::span<const TensorId> ids) {
  if (ids.empty() || !tracks_writes_) return;
  try {
    executor_->written(ids);
  } catch (...) {
    // Giving an extent back failed: the copy is marked stale all the same (the executor
    // clears it first), so nothing is dropped to; the error surfaces like a transfer's.
    record_failure(std::current_exception(), {});
  }
}

void Session::note_nested_writes(const at::RecordFunction& fn) {
  const std::vector<c10::Storage> written =
      written_storages(fn, [this](const at::Tensor& t) { return movable(t); });
  if (written.empty()) return;
  std::lock_guard lock(mutex_);
  if (observing_) forget_kept_copies(ids_of(written));
}

void Session::give_scratch(c10::StorageImpl* impl) {
  try {
    memory_->give_scratch(impl);
  } catch (const std::exception& error) {
    // Inside a callback nothing may escape; the operator then fails on the missing data, and
    // the step raises the error already recorded.
    log::warn("TeraIO: no scratch memory for a storage of ", impl->nbytes(), " bytes: ", error.what());
  }
}

void Session::interrupt_if_due() {
  if (interrupt_due_.exchange(false) && config_.on_failure) config_.on_failure();
}

void Session::count_op(const at::RecordFunction& fn, OpState& op, trace::Phase phase) {
  op.counted = true;
  op.k = op_counter_++;
  op.nested = 0;
  op.used.clear();
  op.inputs = 0;
  op.written.clear();
  const char* name = fn.name();
  op.name = name;
  births_.names.emplace_back(name != nullptr ? name : "?");
  if (phase_ == SessionPhase::kProfile) {
    releases_.sweep([&](TensorId id) { recorder_.release(id, op.k); });
    recorder_.add_op(name != nullptr ? name : "?", phase);
  }
  if (phase_ == SessionPhase::kPlanned && !diverged_) {
    if (op.k >= plan_op_names_.size()) {
      diverge(cat("more than the ", plan_op_names_.size(), " profiled operators"));
    } else if (plan_op_names_[op.k] != (name != nullptr ? name : "")) {
      diverge(cat("operator ", op.k, " is ", name, ", the profile had ", plan_op_names_[op.k]));
    }
  }
}

bool Session::same_operator_last_step(OpIndex k) const {
  return k < births_previous_.names.size() && k < births_.names.size() &&
         births_previous_.names[k] == births_.names[k];
}

std::uint64_t Session::previous_largest_birth(OpIndex k) const {
  if (k < births_previous_.largest.size() && same_operator_last_step(k)) return births_previous_.largest[k];
  return 0;
}

void Session::take_hole() {
  try {
    hole_->take_if_free([this](TensorId id) {
      c10::StorageImpl* impl = table_.find_id(id);
      return impl == nullptr || !table_.alive(id) || impl->data_ptr().get() == nullptr;
    });
  } catch (const std::exception& e) {
    // Without the block the step runs as it would without a hole (its bytes stay unused
    // budget); a failed take is no reason to stop training. Not tried again this step: each
    // try at the device's limit would flush the allocator's cache.
    if (!hole_take_warned_) {
      log::warn(cat("TeraIO: cannot take the large-request hole (", format_bytes(hole_->bytes()),
                    "): ", e.what(), "; the step goes on without it"));
      hole_take_warned_ = true;
    }
    hole_take_failed_ = true;
  }
}

void Session::open_hole(OpIndex k) {
  if (hole_->serves(previous_largest_birth(k))) hole_->open_for(k);
}

std::uint64_t Session::expected_births(OpIndex k) const {
  // The record ends at the previous step's last operator that created a storage: the same
  // operator past it created nothing (W3's optimizer step). Only an operator the previous step
  // did not run here gets the largest birth seen as a guess.
  if (same_operator_last_step(k)) return k < births_previous_.bytes.size() ? births_previous_.bytes[k] : 0;
  return largest_birth_;
}

std::exception_ptr Session::explain_failure(const Error& error, const OpState& op) {
  if (error.kind() != ErrorKind::kInfeasible && error.kind() != ErrorKind::kTierFull) {
    return std::make_exception_ptr(error);
  }
  std::uint64_t working_set = 0;
  for (const TensorId id : op.used) {
    if (c10::StorageImpl* impl = table_.find_id(id)) working_set += impl->nbytes();
  }
  if (config_.gpu_budget == 0 || working_set <= hardware_.gpu_budget) return std::make_exception_ptr(error);
  const std::string name = op.name != nullptr ? op.name : "?";
  std::string hint;
  if (name.rfind("aten::_foreach", 0) == 0 || name.rfind("aten::_fused", 0) == 0) {
    hint =
        " A foreach or fused optimizer updates every parameter in one operator: create it with foreach=False "
        "(and fused=False) so that its step streams parameter by parameter.";
  }
  return std::make_exception_ptr(
      Error(ErrorKind::kInfeasible,
            cat("gpu_budget ", format_bytes(hardware_.gpu_budget), hole_ ? " (after the hole)" : "",
                " is below what operator ", op.k, " (", name, ") uses at once: ", format_bytes(working_set),
                "; no plan can run it.", hint, " (", error.what(), ")")));
}

void Session::run_before_op(OpState& op, bool after_the_fact) {
  const bool holing = hole_ && phase_ == SessionPhase::kPlanned && !diverged_ && !hole_take_failed_;
  // Taken before the executor's fetches, which would otherwise split the block freed last.
  if (holing) take_hole();
  try {
    // Freed storages are swept at the step's end; the executor asks for liveness itself when
    // memory is short. Only the memory of settled transfers goes back per operator, after the
    // executor's work, so that the operator sees storages that own their memory
    // (recordStream, for one, skips an alias).
    {
      const TimedNs timed(callback_parts_.ns(CallbackPart::kBeforeOp));
      memory_->at_op(static_cast<std::uint32_t>(op.k));
      executor_->before_op(op.k, op.used, expected_births(op.k));
    }
    memory_->hand_back_settled(*executor_);
    for (const TensorId id : op.used) {
      c10::StorageImpl* impl = table_.find_id(id);
      if (impl != nullptr && impl->data_ptr().get() == nullptr && impl->nbytes() > 0) {
        throw Error(ErrorKind::kInternal,
                    cat("operator ", op.k, ": tensor ", id, " is not resident after its fetch (",
                        runtime::to_string(executor_->location(id)), ")"));
      }
    }
  } catch (const Error& e) {
    record_failure(explain_failure(e, op), op.used);
  } catch (...) {
    record_failure(std::current_exception(), op.used);
  }
  // Handed over after the executor's own allocations, so that the operator's request finds it;
  // not to an operator seen only at its end (no device inputs), which has allocated already.
  if (holing && !after_the_fact) open_hole(op.k);
  // Also after a failure above: RecordFunction runs the operator anyway, so its writes happen.
  forget_kept_copies(op.written);
  if (timing_ops()) timer_->start(op.k);
  op.start_s = executor_->now_s();
}

void Session::note_host_sync(std::string_view why) {
  std::lock_guard lock(mutex_);
  if (!in_step_ || !observing_) return;
  if (host_syncs_++ == 0) first_host_sync_ = cat(why, " near operator ", op_counter_);
}

void Session::on_op_start(const at::RecordFunction& fn, OpState& op, int depth, trace::Phase phase) {
  interrupt_if_due();
  // At any depth: the read of a scalar is nested in aten::item, a copy in aten::to; but not
  // inside another sync, which the host waits for once.
  if ((device_.is_cuda() || config_.count_cpu_host_syncs) && op.sync_depth < 0) {
    if (const std::string_view why = host_sync(fn, device_); !why.empty()) {
      op.sync_depth = depth;
      note_host_sync(why);
    }
  }
  if (depth > 0) {
    // Nested: the outermost operator already covers its inputs, but not always what it writes.
    if (tracks_writes_) note_nested_writes(fn);
    return;
  }
  op.counted = false;
  op.view = only_makes_views(fn);
  if (op.view) return;  // touches no bytes: nothing to fetch, no use to count
  const auto keep = [this](const at::Tensor& t) { return movable(t); };
  const std::vector<c10::Storage> inputs = storages_of(fn.inputs(), keep);
  // Writes matter only to kept copies: the profile of keep_copies, or a plan that keeps some.
  const std::vector<c10::Storage> written =
      inputs.empty() || !tracks_writes_ ? std::vector<c10::Storage>{} : written_storages(fn, keep);
  std::lock_guard lock(mutex_);
  if (!observing_) return;
  if (!in_step_) {
    // Between steps: operators on offloaded storages fetch them on demand.
    const std::vector<TensorId> ids = ids_of(inputs);
    if (ids.empty()) return;
    try {
      remove_dead();
      executor_->fetch(ids);
      memory_->hand_back_settled(*executor_);
    } catch (...) {
      record_failure(std::current_exception(), ids);
    }
    forget_kept_copies(ids_of(written));
    return;
  }
  if (inputs.empty()) return;  // counted at its end if it produces storages on the device
  count_op(fn, op, phase);
  try {
    std::uint32_t slot = 0;
    for (const auto& s : inputs) {
      const TensorId id = identify(s, FirstSight{op.k, 0, slot++, false}, op.used);
      if (std::find(op.used.begin(), op.used.end(), id) == op.used.end()) op.used.push_back(id);
    }
    op.inputs = op.used.size();
    op.written = ids_of(written);
  } catch (...) {
    // Nothing may escape a callback (RecordFunction would swallow it and run the operator).
    record_failure(std::current_exception(), op.used);
    for (const auto& s : inputs) give_scratch(s.unsafeGetStorageImpl());
    return;
  }
  run_before_op(op);
}

void Session::on_op_end(const at::RecordFunction& fn, OpState& op, int depth) {
  if (depth == op.sync_depth) op.sync_depth = -1;
  interrupt_if_due();
  if (depth > 0 && !op.counted) return;
  if (depth == 0 && op.view) {
    // Its outputs share its input's storage, tracked (or not) as the input is.
    op.view = false;
    return;
  }
  const std::vector<c10::Storage> outputs =
      storages_of(fn.outputs(), [this](const at::Tensor& t) { return movable(t); });
  std::lock_guard lock(mutex_);
  if (!observing_) return;
  if (!in_step_) {
    op.counted = false;
    for (const auto& storage : outputs) {
      if (TrackedStorage* entry = table_.find(storage.unsafeGetStorageImpl())) refresh_size(storage, *entry);
    }
    return;
  }
  try {
    finish_op(fn, op, depth, outputs);
  } catch (...) {
    record_failure(std::current_exception(), {});
  }
}

void Session::finish_op(const at::RecordFunction& fn, OpState& op, int depth,
                        const std::vector<c10::Storage>& outputs) {
  if (depth > 0) {
    // Storages created inside an operator (saved for backward, say) are tracked from birth.
    if (outputs.empty()) return;
    ++op.nested;
    std::uint32_t slot = 0;
    for (const auto& s : outputs) {
      const TensorId id = identify(s, FirstSight{op.k, op.nested, slot++, true}, op.used);
      if (std::find(op.used.begin(), op.used.end(), id) == op.used.end()) op.used.push_back(id);
    }
    return;
  }
  if (!op.counted) {
    if (outputs.empty()) return;
    count_op(fn, op, trace::Phase::kForward);
    run_before_op(op, /*after_the_fact=*/true);
  }
  std::uint32_t slot = 0;
  for (const auto& s : outputs) {
    const TensorId id = identify(s, FirstSight{op.k, 0, slot++, true}, op.used);
    if (std::find(op.used.begin(), op.used.end(), id) == op.used.end()) op.used.push_back(id);
  }
  if (timing_ops()) timer_->stop(op.k);
  if (phase_ == SessionPhase::kProfile) {
    for (const TensorId id : op.used) {
      if (c10::StorageImpl* impl = table_.find_id(id)) recorder_.use(id, op.k, impl->nbytes());
    }
    // Storages born in the operator are written by it, and so are the inputs it may change.
    for (std::size_t i = op.inputs; i < op.used.size(); ++i) recorder_.write(op.used[i], op.k);
    for (const TensorId id : op.written) recorder_.write(id, op.k);
  }
  // An output that is not an input but was tracked before (an operator returning a cached
  // tensor) was written as well.
  forget_kept_copies(std::span<const TensorId>(op.used).subspan(std::min(op.inputs, op.used.size())));
  if (op_spans_.size() < 200000 && (phase_ == SessionPhase::kProfile || phase_ == SessionPhase::kPlanned)) {
    const char* name = fn.name();
    op_spans_.push_back(runtime::OpSpan{name != nullptr ? name : "?", op.start_s, executor_->now_s(),
                                        static_cast<std::uint32_t>(step_index_)});
  }
  try {
    memory_->hand_back_settled(*executor_);
    const TimedNs timed(callback_parts_.ns(CallbackPart::kAfterOp));
    executor_->after_op(op.k, op.used);
  } catch (...) {
    record_failure(std::current_exception(), {});
  }
  op.counted = false;
}

}  // namespace teraio::torch_binding
