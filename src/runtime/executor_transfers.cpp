// runtime/executor_transfers: how the executor moves bytes (see executor_state.hpp).
#include "executor_state.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::runtime {

using namespace executor_detail;

void Executor::State::start_span(TensorId id, Entry& e, plan::Direction direction, bool planned) {
  e.span = TransferSpan{id, direction, plan_tier(e.extent->tier), e.bytes, planned, now_s(), 0};
  in_flight.push_back(id);
  retire_due = true;
  count_bytes(direction, e.extent->tier, e.bytes);
}

io::Transfer Executor::State::close_transfer_open(TensorId id, Entry& e) {
  in_flight.erase(std::find(in_flight.begin(), in_flight.end(), id));
  return std::exchange(e.transfer, io::Transfer{});
}

io::Transfer Executor::State::close_transfer(TensorId id, Entry& e) {
  e.span.end_s = now_s();
  stats.transfers.push_back(e.span);
  return close_transfer_open(id, e);
}

io::CopyPriority Executor::State::priority(const plan::Migration* planned) const {
  // Step and operator in one key; a reactive copy is needed by the operator about to run; a
  // planned deadline before its issue falls in the next step.
  const auto at = [](std::uint64_t step, OpIndex op) { return (step << 32) | op; };
  if (planned == nullptr) return {true, at(steps_begun, current_op)};
  const bool next_step = planned->deadline < planned->issue_before;
  return {planned->urgent, at(steps_begun + (next_step ? 1 : 0), planned->deadline)};
}

bool Executor::State::start_offload(TensorId id, Entry& e, io::TierKind preferred,
                                    const plan::Migration* planned) {
  if (e.copy_kept) {
    drop(id, e);
    return true;
  }
  const auto allocate_extent = [&] {
    std::optional<io::Extent> extent = store.allocate(preferred, e.bytes);
    return extent ? extent : store.allocate(other_tier(preferred), e.bytes);
  };
  std::optional<io::Extent> extent = allocate_extent();
  if (!extent) {
    // Tensors the program freed while away keep their extents until they are forgotten, which
    // happens lazily; the plan counted their space free from their release.
    forget_freed(std::span<const TensorId>(&id, 1));
    extent = allocate_extent();
  }
  // Copies kept for later drops are a saving, not a need: a tensor that must leave comes first.
  while (!extent && give_up_kept_copies(e.bytes)) extent = allocate_extent();
  if (!extent) return false;
  try {
    memory.before_copy_out(id);
    e.transfer =
        store.write(*extent, memory.data(id), io::MemoryKind::kDevice, cat("tensor ", id), priority(planned));
  } catch (...) {
    store.release(*extent);
    throw;
  }
  e.extent = extent;
  start_span(id, e, plan::Direction::kOffload, planned != nullptr);
  set_location(id, e, Location::kOffloading);
  return true;
}

void Executor::State::drop(TensorId id, Entry& e) {
  // No copy to order after the compute stream: the allocator hands the block out again only
  // in stream order, and a fetch into it waits for the compute stream (TensorMemory).
  memory.release(id);
  e.copy_kept = false;
  set_location(id, e, offloaded_location(e.extent->tier));
  ++stats.dropped;
  stats.bytes_dropped += e.bytes;
}

bool Executor::State::give_up_kept_copies(std::uint64_t bytes) {
  std::uint64_t freed = 0;
  for (auto& [id, e] : entries) {
    if (freed >= bytes) break;
    if (!e.copy_kept) continue;
    // Its fetch may still be settling, which holds the extent: wait for it so that the space
    // is free now. A failure there concerns bytes the device already has, so it is only logged.
    if (std::exception_ptr failure = settle(id, current_op)) log_lost(failure);
    invalidate_copy(id, e);
    freed += e.bytes;
    ++stats.copies_given_up;
  }
  return freed > 0;
}

void Executor::State::fetched(Entry& e, std::optional<io::Extent>& release) {
  if (std::exchange(e.keep_after_fetch, false)) {
    e.copy_kept = true;
    return;
  }
  release = std::exchange(e.extent, std::nullopt);
}

void Executor::State::invalidate_copy(TensorId id, Entry& e) {
  e.keep_after_fetch = false;  // a fetch still in flight keeps nothing
  if (!e.copy_kept) return;
  e.copy_kept = false;
  give_back_extent(id, e);
}

void Executor::State::give_back_extent(TensorId id, Entry& e) {
  // A settling transfer of the tensor still uses the extent: it goes back with that transfer.
  for (Settling& s : settling) {
    if (s.id == id && !s.release) {
      s.release = std::exchange(e.extent, std::nullopt);
      return;
    }
  }
  store.release(*std::exchange(e.extent, std::nullopt));
}

bool Executor::State::start_fetch(TensorId id, Entry& e, const plan::Migration* planned,
                                  std::span<const TensorId> keep, bool may_evict) {
  // Its copy out may still be settling: the read must not overtake the write.
  if (std::exception_ptr failure = settle(id, current_op)) std::rethrow_exception(failure);
  void* fresh = may_evict ? allocate(id, e, keep) : reallocate_unless_refused(id);
  if (fresh == nullptr) return false;
  try {
    e.transfer = store.read(*e.extent, fresh, io::MemoryKind::kDevice, priority(planned));
  } catch (...) {
    memory.release(id);
    throw;
  }
  e.keep_after_fetch = planned != nullptr && planned->kept_copy;
  start_span(id, e, plan::Direction::kPrefetch, planned != nullptr);
  set_location(id, e, Location::kFetching);
  return true;
}

void Executor::State::await(const io::Transfer& transfer, OpIndex op, StallCause cause) {
  if (transfer.ready()) return;
  const double start = now_s();
  while (!transfer.wait_for(std::chrono::seconds(1))) {
  }
  record_stall(op, start, now_s(), cause);
}

void Executor::State::record_stall(OpIndex op, double start, double end, StallCause cause) {
  stats.stalls.push_back(StallSpan{op, start, end, cause});
  stats.stall_s += end - start;
  stats.stall_by_cause_s[static_cast<std::size_t>(cause)] += end - start;
}

void Executor::State::settle_on_device(TensorId id, Entry& e) {
  io::CopyEvent& copy = *e.transfer.device_side();
  // Handed over first: if that fails the entry is untouched and the host-wait path can
  // still finish the transfer.
  if (e.location == Location::kOffloading) {
    memory.release_after(id, copy);
  } else {
    TERAIO_ASSERT(e.location == Location::kFetching);
    memory.use_after(id, copy);
  }
  Settling settled{id, close_transfer_open(id, e), e.span, std::nullopt, false};
  if (e.location == Location::kOffloading) {
    set_location(id, e, offloaded_location(e.extent->tier));
  } else {
    fetched(e, settled.release);
    set_location(id, e, Location::kDevice);
  }
  ++stats.device_waits;
  settling.push_back(std::move(settled));
  retire_due = true;
}

std::optional<std::string> Executor::State::wait_out(TensorId id, Entry& e, OpIndex op, StallCause cause) {
  await(e, op, cause);
  const io::Transfer transfer = close_transfer(id, e);
  try {
    transfer.wait();
  } catch (const Error& error) {
    return std::string(error.what());
  }
  return std::nullopt;
}

void Executor::State::complete(TensorId id, Entry& e, OpIndex op) {
  if (settles_on_device(e)) {
    settle_on_device(id, e);
    return;
  }
  await(e, op, StallCause::kTransfer);
  finish(id, e);
}

std::exception_ptr Executor::State::retire_settled(std::size_t index, std::optional<StallCause> wait,
                                                   OpIndex op) {
  Settling done = std::move(settling[index]);
  settling.erase(settling.begin() + static_cast<std::ptrdiff_t>(index));
  if (wait) await(done.transfer, op, *wait);
  done.span.end_s = now_s();
  stats.transfers.push_back(done.span);
  std::exception_ptr failure;
  try {
    done.transfer.wait();
  } catch (...) {
    failure = std::current_exception();
  }
  // A failed prefetch still gives its extent back: the tensor's operators have already read
  // the device memory, so the step fails with this error either way.
  if (done.release) store.release(*done.release);
  if (failure && done.dropped) {
    log_lost(failure);
    return nullptr;
  }
  return failure;
}

std::exception_ptr Executor::State::settle(TensorId id, OpIndex op) {
  std::exception_ptr first;
  for (std::size_t i = settling.size(); i-- > 0;) {
    if (settling[i].id != id) continue;
    std::exception_ptr failure = retire_settled(i, StallCause::kOrdering, op);
    if (failure && !first) first = failure;
  }
  return first;
}

void Executor::State::finish(TensorId id, Entry& e) {
  const io::Transfer transfer = close_transfer(id, e);
  std::exception_ptr failure;
  try {
    transfer.wait();
  } catch (...) {
    failure = std::current_exception();
  }
  const io::Extent extent = *e.extent;
  if (e.location == Location::kOffloading) {
    if (failure) {
      e.extent.reset();
      set_location(id, e, Location::kDevice);
      store.release(extent);
      std::rethrow_exception(failure);
    }
    memory.release(id);
    set_location(id, e, offloaded_location(extent.tier));
  } else {
    TERAIO_ASSERT(e.location == Location::kFetching);
    if (failure) {
      // The fresh allocation holds garbage; the extent still holds the tensor.
      e.keep_after_fetch = false;
      memory.release(id);
      set_location(id, e, offloaded_location(extent.tier));
      std::rethrow_exception(failure);
    }
    std::optional<io::Extent> release;
    fetched(e, release);
    set_location(id, e, Location::kDevice);
    if (release) store.release(*release);
  }
}

void Executor::State::take_back(TensorId id, Entry& e, OpIndex op) {
  if (settles_on_device(e)) {
    // The copy out only reads the memory, which stays the tensor's: the host waits for
    // nothing, but the memory's later uses (its free by the program included) are ordered
    // after the bytes the copy has started, and the rest is not copied. The extent goes back
    // once the host sees the copy done. The entry lets go of the copy first: should
    // cancel_copy_out throw after dropping bytes, a truncated copy must not count as the
    // tensor's offload.
    io::CopyEvent& copying_out = *e.transfer.device_side();
    Settling dropped{id, close_transfer_open(id, e), e.span, std::exchange(e.extent, std::nullopt), true};
    settling.push_back(std::move(dropped));
    retire_due = true;
    set_location(id, e, Location::kDevice);
    ++stats.cancelled_offloads;
    stats.bytes_abandoned += memory.cancel_copy_out(id, copying_out);
    return;
  }
  if (const auto failure = wait_out(id, e, op, StallCause::kTakeBack)) {
    log::warn("offload of tensor ", id, " failed while it was taken back: ", *failure);
  }
  const io::Extent extent = *e.extent;
  e.extent.reset();
  set_location(id, e, Location::kDevice);
  store.release(extent);
  ++stats.cancelled_offloads;
}

std::exception_ptr Executor::State::retire_completed() {
  // Read before looking: a transfer that finishes meanwhile raises the count again.
  const std::uint64_t finished = io::Transfer::finished_count();
  if (!retire_due && finished == finished_seen) return nullptr;
  finished_seen = finished;
  retire_due = false;
  std::exception_ptr settled_failure;
  for (std::size_t i = settling.size(); i-- > 0;) {
    if (!settling[i].transfer.ready()) continue;
    std::exception_ptr failure = retire_settled(i, std::nullopt, current_op);
    if (failure && !settled_failure) settled_failure = failure;
  }
  std::vector<TensorId> done;
  for (const TensorId id : in_flight) {
    if (entries.at(id).transfer.ready()) done.push_back(id);
  }
  std::exception_ptr first = settled_failure;
  for (const TensorId id : done) {
    try {
      finish(id, entries.at(id));
    } catch (...) {
      if (first) {
        log_lost(std::current_exception());
      } else {
        first = std::current_exception();
      }
    }
  }
  return first;
}

void Executor::State::log_lost(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& error) {
    log::warn("runtime executor: ", error.what());
  } catch (...) {
    log::warn("runtime executor: a transfer failed with an unknown exception");
  }
}

void Executor::State::forget(std::unordered_map<TensorId, Entry>::iterator found) {
  const TensorId id = found->first;
  Entry& e = found->second;
  for (Settling& s : settling) {
    if (s.id == id) s.dropped = true;
  }
  if (e.transfer.valid()) {
    if (const auto failure = wait_out(id, e, current_op, StallCause::kForget)) {
      log::debug("transfer of freed tensor ", id, " failed: ", *failure);
    }
  }
  if (e.extent) give_back_extent(id, e);
  if (idle_candidate(e)) idle.erase({e.last_use, id});
  if (holds_device_memory(e.location)) resident -= e.bytes;
  if (in_flight_location(e.location)) ++settled_changes;
  entries.erase(found);
}

void Executor::State::forget_freed(std::span<const TensorId> keep) {
  if (std::exchange(freed_swept, true)) return;
  const double start = now_s();
  std::vector<TensorId> freed;
  for (const auto& [id, e] : entries) {
    if (forgettable(id, keep)) freed.push_back(id);
  }
  ++stats.freed_scans;
  stats.freed_scan_s += now_s() - start;
  for (const TensorId id : freed) forget(entries.find(id));
}

void Executor::State::forget_released(std::span<const TensorId> keep) {
  std::size_t still_alive = 0;
  for (const TensorId id : released) {
    const auto found = entries.find(id);
    if (found == entries.end()) continue;
    if (forgettable(id, keep)) {
      forget(found);
      continue;
    }
    released[still_alive++] = id;
  }
  released.resize(still_alive);
}

void Executor::State::drain(bool keep_valid) {
  std::exception_ptr first;
  while (!settling.empty()) {
    std::exception_ptr failure = retire_settled(0, StallCause::kDrain, current_op);
    if (!failure) continue;
    if (first) {
      log_lost(failure);
    } else {
      first = failure;
    }
  }
  while (!in_flight.empty()) {
    const TensorId id = in_flight.front();
    Entry& e = entries.at(id);
    await(e, current_op, StallCause::kDrain);
    try {
      finish(id, e);
    } catch (...) {
      // finish() leaves the tensor where its bytes are valid when a transfer fails.
      if (first || keep_valid) {
        log_lost(std::current_exception());
      } else {
        first = std::current_exception();
      }
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace teraio::runtime
