#include "session.hpp"

#include <c10/core/Device.h>

#include <algorithm>
#include <unordered_set>

#include "observer.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/trace/lifetime.hpp"
#include "tier_probe.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

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

c10::Device parse_device(const std::string& text) {
  try {
    c10::Device device(text);
    if (device.is_cuda() && !device.has_index()) device.set_index(0);
    if (!device.is_cpu() && !device.is_cuda()) throw Error(ErrorKind::kUnsupported, "");
    return device;
  } catch (const c10::Error&) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("unknown device '", text, "' (expected cpu, cuda or cuda:N)"));
  } catch (const Error&) {
    throw Error(ErrorKind::kUnsupported, cat("device '", text, "' is not supported (cpu or cuda)"));
  }
}

std::unique_ptr<io::DeviceCopier> make_copier(c10::Device device) {
  if (device.is_cpu()) return io::make_host_copier();
#ifdef TERAIO_TORCH_CUDA
  return io::make_cuda_copier(device.index());
#else
  throw Error(ErrorKind::kUnsupported, "this TeraIO build has no CUDA support (built against a CPU torch)");
#endif
}

}  // namespace

std::string_view to_string(SessionPhase phase) {
  switch (phase) {
    case SessionPhase::kWarmup: return "warmup";
    case SessionPhase::kProfile: return "profile";
    case SessionPhase::kPlanned: return "planned";
    case SessionPhase::kPassive: return "passive";
    case SessionPhase::kClosed: return "closed";
  }
  return "?";
}

Session::Session(SessionConfig config) : config_(std::move(config)), device_(parse_device(config_.device)) {
  if (config_.warmup_steps < 0 || config_.profile_steps < 1) {
    throw Error(ErrorKind::kInvalidArgument, cat("warmup_steps must be >= 0 and profile_steps >= 1 (got ",
                                                 config_.warmup_steps, " and ", config_.profile_steps, ")"));
  }
  if (!config_.ssd_paths.empty() && config_.ssd_capacity == 0) {
    throw Error(ErrorKind::kInvalidArgument, "ssd paths given but ssd_capacity is 0");
  }
  copier_ = make_copier(device_);
  io::EngineConfig engine;
  engine.host_capacity = config_.host_budget;
  engine.ssd_paths = config_.ssd_paths;
  engine.ssd_capacity_per_path = config_.ssd_capacity;
  engine.rank = config_.rank;
  // Pinning a large host tier takes seconds (pages are faulted in): done on a thread.
  engine.pin_host_in_background = true;
  engine.wrap_backend = config_.wrap_backend;
  store_ = std::make_unique<io::TierStore>(*copier_, engine);
  memory_ = std::make_unique<StorageMemory>(table_, *copier_, device_);
  runtime::ExecutorConfig executor_config;
  executor_config.budget = config_.gpu_budget;
  executor_ = std::make_unique<runtime::Executor>(*store_, *memory_, executor_config);
  timer_ = make_op_timer(device_);

  hardware_.gpu_budget = config_.gpu_budget;
  hardware_.host_capacity = config_.host_budget;
  hardware_.ssd_capacity = config_.ssd_capacity * config_.ssd_paths.size();
  probe_bandwidths();

  phase_ = config_.warmup_steps > 0 ? SessionPhase::kWarmup : SessionPhase::kProfile;
  phase_steps_left_ = config_.warmup_steps > 0 ? config_.warmup_steps : config_.profile_steps;
  slot_ = observe(this);
  observing_ = true;
}

Session::~Session() {
  try {
    close();
  } catch (const std::exception& e) {
    log::warn(cat("closing the TeraIO session: ", e.what()));
    // The callbacks must never reach a destroyed session, whatever close() could not do.
    stop_observing(slot_);
  }
}

void Session::probe_bandwidths() {
  TierBandwidths measured;
  const bool need =
      config_.d2h_bandwidth <= 0 || config_.h2d_bandwidth <= 0 ||
      (!config_.ssd_paths.empty() && (config_.ssd_read_bandwidth <= 0 || config_.ssd_write_bandwidth <= 0));
  if (need && config_.gpu_budget > 0) measured = probe_tiers(*store_, *copier_, config_.probe_bytes);
  const auto pick = [](double given, double probed, double fallback) {
    if (given > 0) return given;
    return probed > 0 ? probed : fallback;
  };
  // Without a host tier there is nothing to probe the device link with; the PCIe figure then
  // only bounds SSD traffic, which the SSD figures bound more tightly anyway.
  hardware_.d2h_bandwidth = pick(config_.d2h_bandwidth, measured.d2h, 25e9);
  hardware_.h2d_bandwidth = pick(config_.h2d_bandwidth, measured.h2d, 25e9);
  hardware_.ssd_write_bandwidth = pick(config_.ssd_write_bandwidth, measured.ssd_write, 1e9);
  hardware_.ssd_read_bandwidth = pick(config_.ssd_read_bandwidth, measured.ssd_read, 1e9);
  hardware_.gpudirect = false;
}

std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> Session::locations() {
  std::lock_guard lock(mutex_);
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> out;
  if (!observing_) return out;
  remove_dead();
  table_.for_each([&](c10::StorageImpl* impl, TrackedStorage& entry) {
    if (entry.weak.expired() || !executor_->contains(entry.id)) return;
    auto& slot = out[std::string(runtime::to_string(executor_->location(entry.id)))];
    slot.first += 1;
    slot.second += impl->nbytes();
  });
  return out;
}

std::string Session::device_name() const {
  return device_.str();
}

std::string Session::engine_report() const {
  std::lock_guard lock(mutex_);
  if (!store_) return closed_engine_report_;
  return io::format_report(store_->report());
}

runtime::Mode Session::step_mode() const {
  if (config_.gpu_budget == 0) return runtime::Mode::kPassive;
  return phase_ == SessionPhase::kPlanned ? runtime::Mode::kPlanned : runtime::Mode::kReactive;
}

void Session::begin_step() {
  std::lock_guard lock(mutex_);
  if (phase_ == SessionPhase::kClosed) throw Error(ErrorKind::kShutdown, "the TeraIO session is closed");
  if (in_step_) throw Error(ErrorKind::kInvalidArgument, "session.step() entered twice: steps do not nest");
  if (resident_depth_ > 0)
    throw Error(ErrorKind::kInvalidArgument, "session.step() inside session.resident()");
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
  in_step_ = true;
  op_counter_ = 0;
  births_previous_ = std::move(births_);
  births_ = Births{};
  diverged_ = false;
  if (phase_ == SessionPhase::kProfile) {
    recorder_.begin();
    timer_->reset();
  }
  if (observing_) {
    executor_->set_mode(step_mode());
    executor_->begin_step();
  }
  step_start_ = std::chrono::steady_clock::now();
}

void Session::remove_dead() {
  for (const TensorId id : table_.sweep_dead()) executor_->remove_tensor(id);
  memory_->unpin_settled(*executor_);
}

StepRecord Session::end_step() {
  std::lock_guard lock(mutex_);
  if (!in_step_) throw Error(ErrorKind::kInvalidArgument, "end of a step that was not begun");
  in_step_ = false;
  StepRecord record;
  record.step = step_index_++;
  record.phase = phase_;
  record.ops = op_counter_;
#ifdef TERAIO_TORCH_CUDA
  // Honest step times: the step ends when its kernels have.
  if (device_.is_cuda()) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
  record.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  if (observing_) {
    remove_dead();
    if (phase_ == SessionPhase::kPlanned && trace_ && op_counter_ != trace_->ops.size() && !diverged_) {
      diverge(cat("the step ran ", op_counter_, " operators, the profiled one ", trace_->ops.size()));
    }
    record.stats = executor_->end_step();
    record.diverged = diverged_;
    if (timeline_steps_.size() < 16) timeline_steps_.push_back(record.stats);
  }
  if (diverged_) {
    if (++divergent_steps_ >= 2) {
      log::warn("TeraIO: two steps in a row diverged from the profile; profiling again");
      phase_ = SessionPhase::kProfile;
      phase_steps_left_ = config_.profile_steps;
      divergent_steps_ = 0;
      steps_.push_back(record);
      if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
      return record;
    }
  } else {
    divergent_steps_ = 0;
  }
  if (phase_ == SessionPhase::kProfile && !pending_error_) {
    const std::uint64_t step = record.step;
    const auto durations = timer_->durations(recorder_.ops());
    trace_ = recorder_.finish(
        durations,
        [&](TensorId id) {
          c10::StorageImpl* impl = table_.find_id(id);
          const TrackedStorage* entry = impl != nullptr ? table_.find(impl) : nullptr;
          return entry != nullptr && entry->born_step < step;
        },
        cat("profiled by TeraIO on ", device_.str()));
  }
  if (phase_ == SessionPhase::kWarmup || phase_ == SessionPhase::kProfile) {
    if (--phase_steps_left_ <= 0) {
      if (phase_ == SessionPhase::kWarmup) {
        phase_ = SessionPhase::kProfile;
        phase_steps_left_ = config_.profile_steps;
      } else if (!pending_error_) {
        make_plan();
        record.planned_now = true;
      }
    }
  }
  steps_.push_back(record);
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
  return record;
}

void Session::abort_step() {
  std::lock_guard lock(mutex_);
  if (!in_step_) return;
  in_step_ = false;
  if (observing_) {
    remove_dead();
    static_cast<void>(executor_->end_step());
  }
  step_index_++;
  // The step's own exception is what the program sees; when a storage-engine error caused it,
  // that error is raised instead (Python chains the two).
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
}

void Session::make_plan() {
  if (config_.gpu_budget == 0) {
    go_passive();
    return;
  }
  trace::validate(*trace_);
  plan_ = plan::make_plan(*trace_, hardware_);
  const std::vector<std::uint64_t> active = trace::active_bytes(*trace_);
  const auto worst = std::max_element(active.begin(), active.end());
  if (worst != active.end() && *worst > config_.gpu_budget) {
    const auto k = static_cast<std::size_t>(worst - active.begin());
    throw Error(ErrorKind::kInfeasible,
                cat("gpu_budget ", format_bytes(config_.gpu_budget), " is below what operator ", k, " (",
                    trace_->ops[k].name, ") needs at once: ", format_bytes(*worst),
                    "; no plan can reach it. Planner: ", plan_->diagnosis.message));
  }
  if (plan_->plan.migrations.empty() && plan_->plan.peak_before <= config_.gpu_budget) {
    go_passive();
    return;
  }
  if (!plan_->plan.feasible) {
    log::warn(cat("TeraIO: the plan brings the peak to ", format_bytes(plan_->plan.peak_after),
                  ", above the budget ", format_bytes(config_.gpu_budget),
                  " without stalls; reactive eviction covers the rest (", plan_->diagnosis.message, ")"));
  }
  set_migrations(plan_->plan.migrations);
  phase_ = SessionPhase::kPlanned;
}

void Session::set_migrations(std::vector<plan::Migration> migrations) {
  std::lock_guard lock(mutex_);
  if (phase_ == SessionPhase::kClosed) throw Error(ErrorKind::kShutdown, "the TeraIO session is closed");
  if (!plan_ || !trace_) throw Error(ErrorKind::kInvalidArgument, "there is no plan yet");
  for (const auto& m : migrations) {
    if (m.issue_before >= trace_->ops.size() || m.deadline >= trace_->ops.size()) {
      throw Error(ErrorKind::kInvalidArgument,
                  cat("migration of tensor ", m.tensor, " names operator ",
                      std::max(m.issue_before, m.deadline), ", past the step's ", trace_->ops.size()));
    }
  }
  plan_->plan.migrations = std::move(migrations);
  plan_op_names_.clear();
  for (const auto& op : trace_->ops) plan_op_names_.push_back(op.name);
  plan_bytes_.clear();
  for (const auto& tensor : trace_->tensors) plan_bytes_[tensor.id] = tensor.bytes;
  executor_->set_plan(plan_->plan);
}

void Session::stop_with_everything_back() {
  // Tensors outlive the observer: every storage gets its bytes back before it goes.
  executor_->set_mode(runtime::Mode::kPassive);
  executor_->drain();
  remove_dead();
  const std::vector<TensorId> ids = tracked_ids({});
  executor_->fetch(ids);
  for (const TensorId id : ids) executor_->remove_tensor(id);
  memory_->unpin_settled(*executor_);
  table_.clear();
  stop_observing(slot_);
  observing_ = false;
}

void Session::go_passive() {
  // Nothing to move: the steps of a model that fits cost what they cost without TeraIO.
  stop_with_everything_back();
  phase_ = SessionPhase::kPassive;
}

void Session::diverge(const std::string& why) {
  if (diverged_) return;
  diverged_ = true;
  executor_->set_mode(runtime::Mode::kReactive);
  if (!divergence_reported_) {
    log::warn(cat("TeraIO: step ", step_index_, " diverged from the profiled operator sequence (", why,
                  "); this step runs in reactive mode"));
    divergence_reported_ = true;
  }
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
  memory_->unpin_settled(*executor_);
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
  executor_->add_tensor(id, storage.nbytes());
  if (in_step_ && sight.output) {
    if (births_.bytes.size() <= sight.op) births_.bytes.resize(sight.op + 1, 0);
    births_.bytes[sight.op] += storage.nbytes();
    largest_birth_ = std::max(largest_birth_, births_.bytes[sight.op]);
  }
  return id;
}

void Session::record_failure(std::exception_ptr error, const std::vector<TensorId>& used) {
  // RecordFunction swallows exceptions from callbacks and runs the operator anyway, and not
  // every kernel checks for an empty data pointer. So a storage that could not be fetched gets
  // zeroed scratch memory for this operator (its bytes stay valid in the tier, and the next
  // fetch replaces the scratch), the training code is stopped at its next Python statement,
  // and the step ends with this error.
  for (const TensorId id : used) {
    c10::StorageImpl* impl = table_.find_id(id);
    if (impl != nullptr && table_.alive(id)) memory_->give_scratch(impl);
  }
  if (pending_error_) return;
  pending_error_ = error;
  // Raised by the next callback, outside the session's lock: the interrupt takes the GIL,
  // which threads holding the GIL may be waiting to give up while they wait for this lock.
  interrupt_due_ = true;
}

void Session::interrupt_if_due() {
  if (interrupt_due_.exchange(false) && config_.on_failure) config_.on_failure();
}

void Session::count_op(const at::RecordFunction& fn, OpState& op, trace::Phase phase) {
  op.counted = true;
  op.k = op_counter_++;
  op.nested = 0;
  op.used.clear();
  const char* name = fn.name();
  op.name = name;
  births_.names.emplace_back(name != nullptr ? name : "?");
  if (phase_ == SessionPhase::kProfile) recorder_.add_op(name != nullptr ? name : "?", phase);
  if (phase_ == SessionPhase::kPlanned && !diverged_) {
    if (op.k >= plan_op_names_.size()) {
      diverge(cat("more than the ", plan_op_names_.size(), " profiled operators"));
    } else if (plan_op_names_[op.k] != (name != nullptr ? name : "")) {
      diverge(cat("operator ", op.k, " is ", name, ", the profile had ", plan_op_names_[op.k]));
    }
  }
}

std::uint64_t Session::expected_births(OpIndex k) const {
  if (k < births_previous_.bytes.size() && k < births_previous_.names.size() && k < births_.names.size() &&
      births_previous_.names[k] == births_.names[k]) {
    return births_previous_.bytes[k];
  }
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
  if (config_.gpu_budget == 0 || working_set <= config_.gpu_budget) return std::make_exception_ptr(error);
  const std::string name = op.name != nullptr ? op.name : "?";
  std::string hint;
  if (name.rfind("aten::_foreach", 0) == 0 || name.rfind("aten::_fused", 0) == 0) {
    hint =
        " A foreach or fused optimizer updates every parameter in one operator: create it with foreach=False "
        "(and fused=False) so that its step streams parameter by parameter.";
  }
  return std::make_exception_ptr(Error(
      ErrorKind::kInfeasible, cat("gpu_budget ", format_bytes(config_.gpu_budget), " is below what operator ",
                                  op.k, " (", name, ") uses at once: ", format_bytes(working_set),
                                  "; no plan can run it.", hint, " (", error.what(), ")")));
}

void Session::run_before_op(OpState& op) {
  try {
    if (executor_->mode() != runtime::Mode::kPassive) remove_dead();
    executor_->before_op(op.k, op.used, expected_births(op.k));
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
  if (phase_ == SessionPhase::kProfile) timer_->start(op.k);
  op.start_s = executor_->now_s();
}

void Session::on_op_start(const at::RecordFunction& fn, OpState& op, int depth, trace::Phase phase) {
  interrupt_if_due();
  if (depth > 0) return;  // nested: the outermost operator already covers its inputs
  op.counted = false;
  std::vector<c10::Storage> inputs;
  for (const c10::IValue& value : fn.inputs()) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (on_device(t) && t.storage().nbytes() >= config_.min_tensor_bytes) inputs.push_back(t.storage());
    });
  }
  std::lock_guard lock(mutex_);
  if (!observing_) return;
  if (!in_step_) {
    // Between steps: operators on offloaded storages fetch them on demand.
    std::vector<TensorId> ids;
    for (const auto& s : inputs) {
      if (const TrackedStorage* entry = table_.find(s.unsafeGetStorageImpl())) ids.push_back(entry->id);
    }
    if (ids.empty()) return;
    try {
      remove_dead();
      executor_->fetch(ids);
    } catch (...) {
      record_failure(std::current_exception(), ids);
    }
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
  } catch (...) {
    // Nothing may escape a callback (RecordFunction would swallow it and run the operator).
    record_failure(std::current_exception(), op.used);
    for (const auto& s : inputs) memory_->give_scratch(s.unsafeGetStorageImpl());
    return;
  }
  run_before_op(op);
}

void Session::on_op_end(const at::RecordFunction& fn, OpState& op, int depth) {
  interrupt_if_due();
  if (depth > 0 && !op.counted) return;
  std::vector<c10::Storage> outputs;
  for (const c10::IValue& value : fn.outputs()) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (on_device(t) && t.storage().nbytes() >= config_.min_tensor_bytes) outputs.push_back(t.storage());
    });
  }
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
    run_before_op(op);
  }
  std::uint32_t slot = 0;
  for (const auto& s : outputs) {
    const TensorId id = identify(s, FirstSight{op.k, 0, slot++, true}, op.used);
    if (std::find(op.used.begin(), op.used.end(), id) == op.used.end()) op.used.push_back(id);
  }
  if (phase_ == SessionPhase::kProfile) {
    timer_->stop(op.k);
    for (const TensorId id : op.used) {
      if (c10::StorageImpl* impl = table_.find_id(id)) recorder_.use(id, op.k, impl->nbytes());
    }
  }
  if (op_spans_.size() < 200000 && (phase_ == SessionPhase::kProfile || phase_ == SessionPhase::kPlanned)) {
    const char* name = fn.name();
    op_spans_.push_back(runtime::OpSpan{name != nullptr ? name : "?", op.start_s, executor_->now_s(),
                                        static_cast<std::uint32_t>(step_index_)});
  }
  try {
    if (executor_->mode() != runtime::Mode::kPassive) remove_dead();
    executor_->after_op(op.k, op.used);
  } catch (...) {
    record_failure(std::current_exception(), {});
  }
  op.counted = false;
}

std::vector<TensorId> Session::tracked_ids(const std::vector<at::Tensor>& tensors) {
  std::vector<TensorId> ids;
  if (tensors.empty()) {
    table_.for_each([&](c10::StorageImpl*, TrackedStorage& entry) {
      if (!entry.weak.expired()) ids.push_back(entry.id);
    });
    return ids;
  }
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (const TrackedStorage* entry = table_.find(t.storage().unsafeGetStorageImpl())) {
      if (std::find(ids.begin(), ids.end(), entry->id) == ids.end()) ids.push_back(entry->id);
    }
  }
  return ids;
}

std::uint64_t Session::offloaded_bytes(const std::vector<at::Tensor>& tensors) {
  std::lock_guard lock(mutex_);
  if (!observing_) return 0;
  std::uint64_t bytes = 0;
  for (const TensorId id : tracked_ids(tensors)) {
    const runtime::Location where = executor_->location(id);
    if (where == runtime::Location::kHost || where == runtime::Location::kSsd) {
      if (c10::StorageImpl* impl = table_.find_id(id)) bytes += impl->nbytes();
    }
  }
  return bytes;
}

std::uint64_t Session::enter_resident(const std::vector<at::Tensor>& tensors) {
  std::lock_guard lock(mutex_);
  if (in_step_) throw Error(ErrorKind::kInvalidArgument, "session.resident() inside session.step()");
  if (phase_ == SessionPhase::kClosed) throw Error(ErrorKind::kShutdown, "the TeraIO session is closed");
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
  ++resident_depth_;
  if (!observing_) return 0;
  const std::uint64_t bytes = offloaded_bytes(tensors);
  try {
    remove_dead();
    executor_->set_mode(runtime::Mode::kPassive);
    executor_->fetch(tracked_ids(tensors));
  } catch (...) {
    --resident_depth_;
    throw;
  }
  return bytes;
}

void Session::exit_resident() {
  std::lock_guard lock(mutex_);
  if (resident_depth_ > 0) --resident_depth_;
}

void Session::close() {
  std::lock_guard lock(mutex_);
  if (phase_ == SessionPhase::kClosed) return;
  if (observing_) stop_with_everything_back();
  executor_.reset();
  memory_.reset();
  table_.clear();
  closed_engine_report_ = io::format_report(store_->report());
  store_.reset();
  phase_ = SessionPhase::kClosed;
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
}

void Session::export_timeline(const std::string& path) const {
  std::lock_guard lock(mutex_);
  runtime::write_timeline(path, op_spans_, timeline_steps_);
}

}  // namespace teraio::torch_binding
