#include "teraio/runtime/executor.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::runtime {
namespace {

using Clock = std::chrono::steady_clock;

bool holds_device_memory(Location location) {
  return location == Location::kDevice || location == Location::kOffloading ||
         location == Location::kFetching;
}

io::TierKind tier_kind(plan::Tier tier) {
  return tier == plan::Tier::kHost ? io::TierKind::kHost : io::TierKind::kSsd;
}
plan::Tier plan_tier(io::TierKind tier) {
  return tier == io::TierKind::kHost ? plan::Tier::kHost : plan::Tier::kSsd;
}
Location offloaded_location(io::TierKind tier) {
  return tier == io::TierKind::kHost ? Location::kHost : Location::kSsd;
}
io::TierKind other_tier(io::TierKind tier) {
  return tier == io::TierKind::kHost ? io::TierKind::kSsd : io::TierKind::kHost;
}

bool contains_id(std::span<const TensorId> ids, TensorId id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Offloads before prefetches within each urgency: the memory they free comes back sooner.
bool issued_earlier(const plan::Migration& a, const plan::Migration& b) {
  if (a.urgent != b.urgent) return a.urgent;
  return a.direction == plan::Direction::kOffload && b.direction == plan::Direction::kPrefetch;
}

}  // namespace

std::string_view to_string(Location location) {
  switch (location) {
    case Location::kDevice: return "device";
    case Location::kOffloading: return "offloading";
    case Location::kHost: return "host";
    case Location::kSsd: return "ssd";
    case Location::kFetching: return "fetching";
  }
  return "unknown";
}

std::string_view to_string(StallCause cause) {
  switch (cause) {
    case StallCause::kTransfer: return "transfer";
    case StallCause::kOrdering: return "ordering";
    case StallCause::kTakeBack: return "take-back";
    case StallCause::kForget: return "forget";
    case StallCause::kDrain: return "drain";
  }
  return "unknown";
}

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::kPassive: return "passive";
    case Mode::kReactive: return "reactive";
    case Mode::kPlanned: return "planned";
  }
  return "unknown";
}

struct Executor::State {
  struct Entry {
    std::uint64_t bytes = 0;
    Location location = Location::kDevice;
    std::optional<io::Extent> extent;  // where the bytes are (or go, or come from) off the device
    io::Transfer transfer;             // valid while kOffloading or kFetching
    TransferSpan span;                 // of the transfer in flight
    std::uint64_t last_use = 0;        // use clock, for LRU eviction
  };

  State(io::TierStore& s, TensorMemory& m, ExecutorConfig c)
      : store(s), memory(m), config(c), created(Clock::now()) {}

  io::TierStore& store;
  TensorMemory& memory;
  ExecutorConfig config;
  Clock::time_point created;

  mutable std::mutex mutex;
  Mode mode = Mode::kPassive;
  std::vector<std::vector<plan::Migration>> migrations_before;  // by issue_before, in issue order
  NextUses next_uses;
  std::unordered_map<TensorId, Entry> entries;
  // kDevice tensors by last use: the front is the eviction candidate.
  std::set<std::pair<std::uint64_t, TensorId>> idle;
  std::vector<TensorId> in_flight;  // in submission order
  // Transfers whose device side is settled (the device waits for them) but which the host has
  // not seen complete yet; `release` is the extent to give back then (a finished prefetch, or a
  // taken-back offload). Each still holds its extent busy in the store.
  struct Settling {
    TensorId id = 0;
    io::Transfer transfer;
    TransferSpan span;
    std::optional<io::Extent> release;
    // A taken-back offload: the device bytes stayed valid, so its failure is only logged.
    bool dropped = false;
  };
  std::vector<Settling> settling;  // in submission order
  std::uint64_t use_clock = 0;
  std::uint64_t resident = 0;
  std::uint64_t steps_begun = 0;
  OpIndex current_op = 0;
  StepStats stats;

  double now_s() const { return std::chrono::duration<double>(Clock::now() - created).count(); }

  Entry& entry(TensorId id) {
    auto found = entries.find(id);
    if (found == entries.end()) throw Error(ErrorKind::kInvalidArgument, cat("unknown tensor ", id));
    return found->second;
  }

  // Empty tensors are never evicted: moving them frees nothing.
  static bool idle_candidate(const Entry& e) { return e.location == Location::kDevice && e.bytes > 0; }

  void set_location(TensorId id, Entry& e, Location location) {
    if (idle_candidate(e)) idle.erase({e.last_use, id});
    if (holds_device_memory(e.location)) resident -= e.bytes;
    e.location = location;
    if (idle_candidate(e)) idle.insert({e.last_use, id});
    if (holds_device_memory(location)) {
      resident += e.bytes;
      stats.peak_resident = std::max(stats.peak_resident, resident);
    }
  }

  void touch(TensorId id, Entry& e) {
    if (idle_candidate(e)) idle.erase({e.last_use, id});
    e.last_use = ++use_clock;
    if (idle_candidate(e)) idle.insert({e.last_use, id});
  }

  void count_bytes(plan::Direction direction, io::TierKind tier, std::uint64_t bytes) {
    const bool host = tier == io::TierKind::kHost;
    if (direction == plan::Direction::kOffload) {
      (host ? stats.bytes_to_host : stats.bytes_to_ssd) += bytes;
    } else {
      (host ? stats.bytes_from_host : stats.bytes_from_ssd) += bytes;
    }
  }

  void start_span(TensorId id, Entry& e, plan::Direction direction, bool planned) {
    e.span = TransferSpan{id, direction, plan_tier(e.extent->tier), e.bytes, planned, now_s(), 0};
    in_flight.push_back(id);
    count_bytes(direction, e.extent->tier, e.bytes);
  }

  // Takes a transfer still running off the entry (its span is recorded when it settles).
  io::Transfer close_transfer_open(TensorId id, Entry& e) {
    in_flight.erase(std::find(in_flight.begin(), in_flight.end(), id));
    return std::exchange(e.transfer, io::Transfer{});
  }

  // Takes the finished transfer off the entry and records its span.
  io::Transfer close_transfer(TensorId id, Entry& e) {
    e.span.end_s = now_s();
    stats.transfers.push_back(e.span);
    return close_transfer_open(id, e);
  }

  // Copies a kDevice tensor out to `preferred` (or the other tier when it is full); false when
  // neither tier has room.
  bool start_offload(TensorId id, Entry& e, io::TierKind preferred, bool planned) {
    const auto allocate_extent = [&] {
      std::optional<io::Extent> extent = store.allocate(preferred, e.bytes);
      return extent ? extent : store.allocate(other_tier(preferred), e.bytes);
    };
    std::optional<io::Extent> extent = allocate_extent();
    if (!extent) {
      // Tensors the program freed while away keep their extents until they are forgotten, which
      // happens lazily; the plan counted their space free from their release.
      forget_freed(id);
      extent = allocate_extent();
    }
    if (!extent) return false;
    try {
      memory.before_copy_out(id);
      e.transfer = store.write(*extent, memory.data(id), io::MemoryKind::kDevice, cat("tensor ", id));
    } catch (...) {
      store.release(*extent);
      throw;
    }
    e.extent = extent;
    start_span(id, e, plan::Direction::kOffload, planned);
    set_location(id, e, Location::kOffloading);
    return true;
  }

  void start_fetch(TensorId id, Entry& e, bool planned, std::span<const TensorId> keep) {
    // Its copy out may still be settling: the read must not overtake the write.
    if (std::exception_ptr failure = settle(id, current_op)) std::rethrow_exception(failure);
    void* fresh = allocate(id, e, keep);
    try {
      e.transfer = store.read(*e.extent, fresh, io::MemoryKind::kDevice);
    } catch (...) {
      memory.release(id);
      throw;
    }
    start_span(id, e, plan::Direction::kPrefetch, planned);
    set_location(id, e, Location::kFetching);
  }

  // Blocks until the transfer has finished, counting the wait as a stall of `op`. Does not
  // throw: the caller looks at the outcome.
  void await(const io::Transfer& transfer, OpIndex op, StallCause cause) {
    if (transfer.ready()) return;
    const double start = now_s();
    while (!transfer.wait_for(std::chrono::seconds(1))) {
    }
    const double end = now_s();
    stats.stalls.push_back(StallSpan{op, start, end, cause});
    stats.stall_s += end - start;
    stats.stall_by_cause_s[static_cast<std::size_t>(cause)] += end - start;
  }
  void await(Entry& e, OpIndex op, StallCause cause) { await(e.transfer, op, cause); }

  // Hands the entry's transfer over to the device (its device_side() must be set): the memory
  // of an offload is released behind its copy, a prefetched tensor may be used behind its copy.
  // The host retires the transfer later (retire_settled), when it sees it complete.
  void settle_on_device(TensorId id, Entry& e) {
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
      settled.release = std::exchange(e.extent, std::nullopt);
      set_location(id, e, Location::kDevice);
    }
    ++stats.device_waits;
    settling.push_back(std::move(settled));
  }

  static bool settles_on_device(const Entry& e) { return e.transfer.device_side() != nullptr; }

  // Finishes the entry's transfer as far as the operators are concerned: handed to the device
  // where it has a device side, else waited for and retired on the host.
  void complete(TensorId id, Entry& e, OpIndex op) {
    if (settles_on_device(e)) {
      settle_on_device(id, e);
      return;
    }
    await(e, op, StallCause::kTransfer);
    finish(id, e);
  }

  // Retires one settled transfer the host has seen complete (or waits for it when `wait`).
  // Its failure concerns bytes the device already relied on, so it is returned to be raised.
  std::exception_ptr retire_settled(std::size_t index, std::optional<StallCause> wait, OpIndex op) {
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

  // Waits for the settling transfers of one tensor: before its extent is read again or given back.
  std::exception_ptr settle(TensorId id, OpIndex op) {
    std::exception_ptr first;
    for (std::size_t i = settling.size(); i-- > 0;) {
      if (settling[i].id != id) continue;
      std::exception_ptr failure = retire_settled(i, StallCause::kOrdering, op);
      if (failure && !first) first = failure;
    }
    return first;
  }

  // Retires a finished transfer. An offload frees the device memory; a prefetch frees the
  // extent. On failure the tensor stays where its bytes are valid and the error is rethrown.
  void finish(TensorId id, Entry& e) {
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
        memory.release(id);
        set_location(id, e, offloaded_location(extent.tier));
        std::rethrow_exception(failure);
      }
      e.extent.reset();
      set_location(id, e, Location::kDevice);
      store.release(extent);
    }
  }

  // An offload still in flight whose tensor is needed again: the device copy never stopped
  // being valid, so the copy out is dropped once the store is done with it.
  void take_back(TensorId id, Entry& e, OpIndex op) {
    if (settles_on_device(e)) {
      // The copy out only reads the memory, which stays the tensor's: nothing to wait for. The
      // extent goes back once the host sees the copy done.
      Settling dropped{id, close_transfer_open(id, e), e.span, std::exchange(e.extent, std::nullopt), true};
      settling.push_back(std::move(dropped));
      set_location(id, e, Location::kDevice);
      ++stats.cancelled_offloads;
      return;
    }
    await(e, op, StallCause::kTakeBack);
    const io::Transfer transfer = close_transfer(id, e);
    try {
      transfer.wait();
    } catch (const Error& error) {
      log::warn("offload of tensor ", id, " failed while it was taken back: ", error.what());
    }
    const io::Extent extent = *e.extent;
    e.extent.reset();
    set_location(id, e, Location::kDevice);
    store.release(extent);
    ++stats.cancelled_offloads;
  }

  // Retires every finished transfer. A failure concerns a tensor that is already back where
  // its bytes are valid, so it is returned rather than thrown: the caller first finishes
  // making the operator's tensors resident.
  std::exception_ptr retire_completed() {
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

  // Runs work, then rethrows `pending`; if work throws, that error wins and pending is logged.
  template <typename Work>
  void then_rethrow(std::exception_ptr pending, Work&& work) {
    try {
      work();
    } catch (...) {
      if (pending) log_lost(pending);
      throw;
    }
    if (pending) std::rethrow_exception(pending);
  }

  static void log_lost(std::exception_ptr failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& error) {
      log::warn("runtime executor: ", error.what());
    } catch (...) {
      log::warn("runtime executor: a transfer failed with an unknown exception");
    }
  }

  std::string over_budget(OpIndex op, std::uint64_t incoming, std::string_view why) const {
    return cat("tracked tensors hold ", resident, " bytes",
               incoming > 0 ? cat(" (+", incoming, " to fetch)") : "", ", over the device budget of ",
               config.budget, " bytes, at operator ", op, ": ", why);
  }

  // Stops tracking a tensor the program freed: its transfer in flight (if any) is waited for
  // and its extent released. Transfers already settled on the device are not waited for:
  // nobody needs their bytes any more, so they only give the extent back once the host sees
  // them done (and a failure of theirs is only logged).
  void forget(std::unordered_map<TensorId, Entry>::iterator found) {
    const TensorId id = found->first;
    Entry& e = found->second;
    for (Settling& s : settling) {
      if (s.id != id) continue;
      s.dropped = true;
      // A settling copy out writes the extent the entry still names: it goes back with it.
      if (!s.release && e.extent) s.release = std::exchange(e.extent, std::nullopt);
    }
    if (e.transfer.valid()) {
      await(e, current_op, StallCause::kForget);
      const io::Transfer transfer = close_transfer(id, e);
      try {
        transfer.wait();
      } catch (const Error& error) {
        log::debug("transfer of freed tensor ", id, " failed: ", error.what());
      }
    }
    if (e.extent) store.release(*e.extent);
    if (idle_candidate(e)) idle.erase({e.last_use, id});
    if (holds_device_memory(e.location)) resident -= e.bytes;
    entries.erase(found);
  }

  // Forgets every tensor the program has freed; only needed when memory is short, so the
  // owner does not have to report frees operator by operator. `keep` stays even if freed: the
  // caller holds a reference to its entry (the program may free it from another thread).
  void forget_freed(std::optional<TensorId> keep = std::nullopt) {
    std::vector<TensorId> freed;
    for (const auto& [id, e] : entries) {
      if (id != keep && !memory.alive(id)) freed.push_back(id);
    }
    for (const TensorId id : freed) forget(entries.find(id));
  }

  // What free_down_to throws when nothing more can be moved out.
  static bool no_room(const Error& error) {
    return error.kind() == ErrorKind::kInfeasible || error.kind() == ErrorKind::kTierFull;
  }

  // Outside kPassive, frees device memory until `incoming` more bytes fit the budget.
  void make_room(OpIndex op, std::span<const TensorId> keep, std::uint64_t incoming) {
    if (mode == Mode::kPassive || config.budget == 0) return;
    if (resident + incoming > config.budget) forget_freed();
    free_down_to(op, keep, incoming, config.budget);
  }

  // The idle tensor to evict, not one of `keep`: in a planned step the one used furthest ahead,
  // which is what the simulator evicts and the plan's model assumes; otherwise (no plan, or a
  // divergent step whose future the trace does not tell) the least recently used. `idle` is in
  // LRU order, so among equals the least recently used goes.
  std::optional<TensorId> pick_victim(OpIndex op, std::span<const TensorId> keep) const {
    std::optional<TensorId> best;
    std::uint64_t best_next = 0;
    for (const auto& [last_use, id] : idle) {
      if (contains_id(keep, id)) continue;
      if (mode != Mode::kPlanned || next_uses.empty()) return id;
      const std::uint64_t next = next_uses.after(id, op);
      if (!best || next > best_next) {
        best = id;
        best_next = next;
      }
    }
    return best;
  }

  // Frees device memory until resident + incoming <= limit: first by waiting for offloads
  // already under way, then by evicting the least recently used idle tensor. Tensors in `keep`
  // stay.
  void free_down_to(OpIndex op, std::span<const TensorId> keep, std::uint64_t incoming, std::uint64_t limit) {
    while (resident + incoming > limit) {
      auto offloading = std::find_if(in_flight.begin(), in_flight.end(), [&](TensorId id) {
        return entries.at(id).location == Location::kOffloading && !contains_id(keep, id);
      });
      if (offloading != in_flight.end()) {
        complete(*offloading, entries.at(*offloading), op);
        continue;
      }
      const std::optional<TensorId> victim = pick_victim(op, keep);
      if (!victim) {
        throw Error(ErrorKind::kInfeasible,
                    over_budget(op, incoming, "no idle resident tensor left to evict"));
      }
      const TensorId id = *victim;
      Entry& e = entries.at(id);
      if (!start_offload(id, e, io::TierKind::kHost, false)) {
        throw Error(ErrorKind::kTierFull,
                    over_budget(op, incoming,
                                cat("neither the host nor the SSD tier has room for tensor ", id, " (",
                                    e.bytes, " bytes)")));
      }
      ++stats.evictions;
      log::debug("evict tensor ", id, " (", e.bytes, " bytes) at operator ", op, ": ", resident,
                 " resident + ", incoming, " incoming over ", limit);
      complete(id, e, op);
    }
  }

  // A fresh allocation for a fetch. The allocator may refuse one although the tracked tensors
  // are within the budget (memory TeraIO does not track, blocks too fragmented to join): then
  // as many bytes again are moved out beyond the budget, the allocator's cached blocks go back
  // to the device, and it is asked once more; a second refusal is raised.
  void* allocate(TensorId id, Entry& e, std::span<const TensorId> keep) {
    try {
      return memory.reallocate(id);
    } catch (const Error& error) {
      if (error.kind() != ErrorKind::kOutOfMemory) throw;
      log::debug("fetch of tensor ", id, " refused by the allocator, freeing ", e.bytes,
                 " bytes: ", error.what());
    }
    ++stats.allocation_retries;
    forget_freed();
    std::vector<TensorId> stay(keep.begin(), keep.end());
    stay.push_back(id);
    try {
      free_down_to(current_op, stay, 0, resident > e.bytes ? resident - e.bytes : 0);
    } catch (const Error& error) {
      // Nothing idle left to move: the retry below says whether what was freed suffices.
      if (!no_room(error)) throw;
    }
    memory.trim();
    return memory.reallocate(id);
  }

  void demand_fetch(TensorId id, Entry& e, OpIndex op, std::span<const TensorId> keep) {
    log::debug("demand fetch of tensor ", id, " (", e.bytes, " bytes) at operator ", op);
    make_room(op, keep, e.bytes);
    start_fetch(id, e, false, keep);
    ++stats.demand_fetches;
    complete(id, e, op);
  }

  void make_resident(TensorId id, Entry& e, OpIndex op, std::span<const TensorId> keep) {
    switch (e.location) {
      case Location::kDevice: return;
      case Location::kOffloading: take_back(id, e, op); return;
      case Location::kFetching: complete(id, e, op); return;
      case Location::kHost:
      case Location::kSsd: demand_fetch(id, e, op, keep); return;
    }
  }

  void issue(const plan::Migration& migration, OpIndex op, std::span<const TensorId> used) {
    auto found = entries.find(migration.tensor);
    if (found == entries.end()) {
      ++stats.skipped;
      return;
    }
    if (!memory.alive(migration.tensor)) {
      forget(found);
      ++stats.skipped;
      return;
    }
    const TensorId id = found->first;
    Entry& e = found->second;
    if (migration.direction == plan::Direction::kOffload) {
      // A stale plan may offload a tensor this very operator uses: it would be taken back at once.
      if (e.location != Location::kDevice || contains_id(used, id) ||
          !start_offload(id, e, tier_kind(migration.tier), true)) {
        ++stats.skipped;
        return;
      }
      ++stats.planned_offloads;
      return;
    }
    if (e.location == Location::kOffloading) {
      take_back(id, e, op);
      return;
    }
    if (e.location != Location::kHost && e.location != Location::kSsd) {
      ++stats.skipped;
      return;
    }
    std::vector<TensorId> keep(used.begin(), used.end());
    keep.push_back(id);
    try {
      make_room(op, keep, e.bytes);
      start_fetch(id, e, true, keep);
    } catch (const Error& error) {
      // No room now (nothing left to move, or the allocator refused twice): the operators
      // before its use may free memory; if not, the use fetches it on demand.
      if (!no_room(error) && error.kind() != ErrorKind::kOutOfMemory) throw;
      log::debug("planned prefetch of tensor ", id, " skipped: ", error.what());
      ++stats.skipped;
      return;
    }
    ++stats.planned_prefetches;
  }

  void drain() {
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
        if (first) {
          log_lost(std::current_exception());
        } else {
          first = std::current_exception();
        }
      }
    }
    if (first) std::rethrow_exception(first);
  }
};

Executor::Executor(io::TierStore& store, TensorMemory& memory, ExecutorConfig config)
    : state_(std::make_unique<State>(store, memory, config)) {}

Executor::~Executor() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  try {
    s.drain();
  } catch (const std::exception& error) {
    log::warn("runtime executor: a transfer failed while shutting down: ", error.what());
  }
  for (auto& [id, e] : s.entries) {
    if (!e.extent) continue;
    try {
      s.store.release(*e.extent);
    } catch (const std::exception& error) {
      log::warn("runtime executor: cannot release the extent of tensor ", id, ": ", error.what());
    }
  }
}

void Executor::set_plan(const plan::Plan& plan) {
  std::vector<std::vector<plan::Migration>> index;
  for (const plan::Migration& m : plan.migrations) {
    if (m.issue_before >= index.size()) index.resize(std::size_t{m.issue_before} + 1);
    index[m.issue_before].push_back(m);
  }
  for (auto& bucket : index) std::stable_sort(bucket.begin(), bucket.end(), issued_earlier);
  std::lock_guard lock(state_->mutex);
  state_->migrations_before = std::move(index);
}

void Executor::set_next_uses(NextUses next_uses) {
  std::lock_guard lock(state_->mutex);
  state_->next_uses = std::move(next_uses);
}

void Executor::set_mode(Mode mode) {
  std::lock_guard lock(state_->mutex);
  state_->mode = mode;
  state_->stats.mode = mode;
}

Mode Executor::mode() const {
  std::lock_guard lock(state_->mutex);
  return state_->mode;
}

std::uint64_t Executor::budget() const {
  return state_->config.budget;
}

void Executor::add_tensor(TensorId id, std::uint64_t bytes) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto [it, inserted] = s.entries.try_emplace(id);
  if (!inserted) throw Error(ErrorKind::kInvalidArgument, cat("tensor ", id, " is already tracked"));
  State::Entry& e = it->second;
  e.bytes = bytes;
  e.last_use = ++s.use_clock;
  e.location = Location::kHost;  // not yet counted: set_location adds it to the resident bytes
  s.set_location(id, e, Location::kDevice);
}

void Executor::remove_tensor(TensorId id) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto found = s.entries.find(id);
  if (found == s.entries.end()) return;
  s.forget(found);
}

bool Executor::contains(TensorId id) const {
  std::lock_guard lock(state_->mutex);
  return state_->entries.contains(id);
}

Location Executor::location(TensorId id) const {
  std::lock_guard lock(state_->mutex);
  return state_->entry(id).location;
}

std::uint64_t Executor::resident_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->resident;
}

std::size_t Executor::tensor_count() const {
  std::lock_guard lock(state_->mutex);
  return state_->entries.size();
}

void Executor::begin_step() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.stats = StepStats{};
  s.stats.step = s.steps_begun++;
  s.stats.mode = s.mode;
  s.stats.peak_resident = s.resident;
}

void Executor::before_op(OpIndex k, std::span<const TensorId> used, std::uint64_t incoming_bytes) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.current_op = k;
  s.then_rethrow(s.retire_completed(), [&] {
    if (s.mode == Mode::kPlanned && k < s.migrations_before.size()) {
      for (const plan::Migration& m : s.migrations_before[k]) s.issue(m, k, used);
    }
    for (const TensorId id : used) {
      auto found = s.entries.find(id);
      if (found != s.entries.end()) s.make_resident(id, found->second, k, used);
    }
    for (const TensorId id : used) {
      auto found = s.entries.find(id);
      if (found != s.entries.end()) s.touch(id, found->second);
    }
    s.make_room(k, used, incoming_bytes);
  });
}

void Executor::after_op(OpIndex k, std::span<const TensorId> used) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.then_rethrow(s.retire_completed(), [&] { s.make_room(k, used, 0); });
}

StepStats Executor::end_step() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  StepStats done = std::move(s.stats);
  s.stats = StepStats{};
  s.stats.step = s.steps_begun;
  s.stats.mode = s.mode;
  s.stats.peak_resident = s.resident;
  return done;
}

void Executor::fetch(std::span<const TensorId> ids) {
  fetch(ids, ids);
}

void Executor::fetch(std::span<const TensorId> ids, std::span<const TensorId> keep) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  std::vector<TensorId> kept(keep.begin(), keep.end());
  kept.insert(kept.end(), ids.begin(), ids.end());
  s.then_rethrow(s.retire_completed(), [&] {
    for (const TensorId id : ids) {
      auto found = s.entries.find(id);
      if (found == s.entries.end()) continue;
      s.make_resident(id, found->second, s.current_op, kept);
      s.touch(id, found->second);
    }
  });
}

void Executor::fetch_all() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  std::uint64_t total = 0;
  std::vector<TensorId> ids;
  ids.reserve(s.entries.size());
  for (const auto& [id, e] : s.entries) {
    total += e.bytes;
    ids.push_back(id);
  }
  if (s.config.budget != 0 && total > s.config.budget) {
    throw Error(ErrorKind::kInfeasible, cat("cannot make every tracked tensor resident: they hold ", total,
                                            " bytes, over the device budget of ", s.config.budget,
                                            " bytes by ", total - s.config.budget));
  }
  s.then_rethrow(s.retire_completed(), [&] {
    for (const TensorId id : ids) {
      State::Entry& e = s.entries.at(id);
      s.make_resident(id, e, s.current_op, ids);
      s.touch(id, e);
    }
  });
}

void Executor::drain() {
  std::lock_guard lock(state_->mutex);
  state_->drain();
}

double Executor::now_s() const {
  return state_->now_s();
}

}  // namespace teraio::runtime
