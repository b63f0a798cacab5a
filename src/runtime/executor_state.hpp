// runtime/executor_state: the executor's state, private to the runtime module. Split by
// concern: executor_transfers.cpp moves bytes (offloads, fetches, their completion on the host
// or the device, forgetting freed tensors), executor_eviction.cpp decides what has to move
// (holding the budget, demand fetches, the plan's migrations), executor.cpp is the public API.
// Every member runs under `mutex`, taken by the public API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/runtime/executor.hpp"

namespace teraio::runtime {

namespace executor_detail {

inline bool holds_device_memory(Location location) {
  return location == Location::kDevice || location == Location::kOffloading ||
         location == Location::kFetching;
}

inline io::TierKind tier_kind(plan::Tier tier) {
  return tier == plan::Tier::kHost ? io::TierKind::kHost : io::TierKind::kSsd;
}
inline plan::Tier plan_tier(io::TierKind tier) {
  return tier == io::TierKind::kHost ? plan::Tier::kHost : plan::Tier::kSsd;
}
inline Location offloaded_location(io::TierKind tier) {
  return tier == io::TierKind::kHost ? Location::kHost : Location::kSsd;
}
inline io::TierKind other_tier(io::TierKind tier) {
  return tier == io::TierKind::kHost ? io::TierKind::kSsd : io::TierKind::kHost;
}

inline bool contains_id(std::span<const TensorId> ids, TensorId id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace executor_detail

struct Executor::State {
  using Clock = std::chrono::steady_clock;

  struct Entry {
    std::uint64_t bytes = 0;
    Location location = Location::kDevice;
    std::optional<io::Extent> extent;  // where the bytes are (or go, or come from) off the device
    io::Transfer transfer;             // valid while kOffloading or kFetching
    TransferSpan span;                 // of the transfer in flight
    std::uint64_t last_use = 0;        // use clock, for LRU eviction
    // kDevice only: `extent` still holds the bytes the device has (a prefetch that kept its
    // copy, plan::Migration::kept_copy), so moving the tensor out only drops device memory.
    bool copy_kept = false;
    bool keep_after_fetch = false;  // kFetching: the extent stays once the fetch is done
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
  // Each tensor whose last migration in a step is an offload (that migration): the plan has it
  // away at every step's start, as the simulator's steady state does. A step that follows
  // another mode, or another plan, starts with some of them on the device; left there, they
  // fill the memory the plan gave the first micro-batches, which then evict reactively
  // (Executor::position_for_plan).
  std::vector<plan::Migration> away_at_start;
  // Each tensor whose first migration in a step is an offload: the operator it is issued before.
  // One used last at the step's end leaves at its start (Executor::position_for_plan does not
  // fetch it back for that).
  std::unordered_map<TensorId, OpIndex> leaves_first;
  // Each tensor whose last migration in a step is a prefetch that keeps the tier's copy, and that
  // tier: the plan starts every step with it on the device and that copy in the tier, so a fetch
  // back by positioning from the same tier keeps the copy too (its next offload then drops
  // instead of copying). From another tier (a reactive eviction's) it does not: the copy would
  // stay there for good, each drop and kept prefetch reusing it.
  std::unordered_map<TensorId, plan::Tier> kept_at_start;
  // Each tensor's migrations in a step, by issue point (ties in issue order): where the plan has
  // it at an operator (plan_has_away), for the late-free count of an eviction (late_bytes) and the
  // debug log's account of it (against_plan). Holding the
  // budget, an eviction in a step that follows a plan means the device holds more than the
  // plan's memory there (the executor has waited for the offloads under way first); which
  // tensors make the difference is what a GPU run's log has to say (session 35: W2's 33
  // evictions a step, 4 simulated). Built with the plan, a few bytes per migration.
  std::unordered_map<TensorId, std::vector<std::pair<OpIndex, plan::Direction>>> moves;
  NextUses next_uses;
  std::unordered_map<TensorId, Entry> entries;
  // kDevice tensors by last use: in this order pick_victim looks for one to evict (least
  // recently used first; in a planned step it breaks ties between equally distant next uses).
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
  // retire_completed() looks at each transfer above only when one may have become ready since
  // it last looked (a transfer finished somewhere, or one was added): it runs before and after
  // every operator, and each look takes a lock per transfer in flight.
  std::uint64_t finished_seen = ~std::uint64_t{0};
  bool retire_due = true;
  // Bumped whenever a tensor leaves kOffloading or kFetching (its transfer settled, or it was
  // forgotten meanwhile): see Executor::settled_changes().
  std::uint64_t settled_changes = 0;

  static bool in_flight_location(Location location) {
    return location == Location::kOffloading || location == Location::kFetching;
  }
  // Set once forget_freed() has scanned in the current executor call. The training code frees
  // tensors between the calls (its operators run outside them); one freed during a call, from
  // another thread, is seen by the next call's scan, and an eviction checks its victim anyway
  // (free_down_to). At the budget's edge every prefetch and demand fetch makes room, and a scan
  // looks at every tracked tensor. Cleared when a call begins (Call).
  bool freed_swept = false;
  // One executor call: begins it (freed_swept), and ends it on every way out: outside a step,
  // or without a budget to count them in (kPassive, or none set), spare blocks go back then.
  class Call {
   public:
    explicit Call(State& s) : s_(s) { s_.freed_swept = false; }
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    State& s_;
  };
  // Planned steps: the step-local tensors past their profiled release (NextUses::released_at),
  // which the program is expected to have freed. make_room checks these few for liveness
  // instead of every tracked tensor; those still alive stay listed. Cleared each step: the
  // owner forgets what was freed after a step's last operator at the step's end (the torch
  // session's sweep), and free_down_to forgets any other freed tensor it picks.
  std::vector<TensorId> released;
  // Set during after_op(k)'s room-making to k: the tensors `released` got for operator k are
  // not late yet, the program frees them after the call (against_plan).
  std::optional<OpIndex> releasing_after;
  // Whether this step follows a plan whose trace says which tensors the program frees when.
  bool follows_plan() const { return mode == Mode::kPlanned && !next_uses.empty(); }
  std::uint64_t use_clock = 0;
  std::uint64_t resident = 0;
  std::uint64_t steps_begun = 0;
  bool in_step = false;  // between begin_step() and end_step()
  // Gives every spare block back to the allocator (TensorMemory::give_back_spares); never throws.
  void give_back_all_spares();
  // Sends the tensors of away_at_start still on the device out (StepStats::positioned), then
  // takes back the offloads under way of persistent tensors the plan has on the device, and
  // fetches those that are away while they fit (both StepStats::positioned_back).
  void position_for_plan();
  // Whether `bytes` more (a fetch) fit the budget without evicting: spare blocks given back and
  // offloads under way counted done (complete(): on the device's stream where the copier can),
  // the waits only when the fetch can fit once they are.
  bool fits_after_offloads(std::uint64_t bytes);
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
  // Device memory held, and some of it: what against_plan and late_bytes account for.
  static bool occupies_device(const Entry& e) {
    return executor_detail::holds_device_memory(e.location) && e.bytes > 0;
  }

  void set_location(TensorId id, Entry& e, Location location) {
    if (in_flight_location(e.location) && !in_flight_location(location)) ++settled_changes;
    if (idle_candidate(e)) idle.erase({e.last_use, id});
    if (executor_detail::holds_device_memory(e.location)) resident -= e.bytes;
    e.location = location;
    if (idle_candidate(e)) idle.insert({e.last_use, id});
    if (executor_detail::holds_device_memory(location)) {
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

  void start_span(TensorId id, Entry& e, plan::Direction direction, bool planned);

  // Takes a transfer still running off the entry (its span is recorded when it settles).
  io::Transfer close_transfer_open(TensorId id, Entry& e);

  // Takes the finished transfer off the entry and records its span.
  io::Transfer close_transfer(TensorId id, Entry& e);

  // Copies a kDevice tensor out to `preferred` (or the other tier when it is full); false when
  // neither tier has room.
  // `planned` is the plan's migration, or nullptr for a reactive transfer (eviction, demand).
  bool start_offload(TensorId id, Entry& e, io::TierKind preferred, const plan::Migration* planned);

  // Allocates the tensor's block (allocate(), which may move others out for room) and starts
  // its copy in. Without `may_evict`, a refused allocation moves nothing and returns false.
  bool start_fetch(TensorId id, Entry& e, const plan::Migration* planned, std::span<const TensorId> keep,
                   bool may_evict = true);
  // A kDevice tensor whose extent kept its copy leaves without a transfer: the device memory
  // goes back at once and the extent is where its bytes are.
  void drop(TensorId id, Entry& e);
  // After a fetch: gives the extent back, or keeps it as the tensor's copy.
  void fetched(Entry& e, std::optional<io::Extent>& release);
  // The tensor's bytes change on the device: a copy kept in its extent is stale.
  void invalidate_copy(TensorId id, Entry& e);
  // Gives the entry's extent back: now, or once the tensor's settling transfer that still uses
  // it is seen done (a copy out writing it, a fetch reading it).
  void give_back_extent(TensorId id, Entry& e);
  // A tier is full: gives the extents of kept copies back (at least `bytes`, when there are
  // that many); false when there was none.
  bool give_up_kept_copies(std::uint64_t bytes);
  // How pressing the copy is, in the planner's terms (io::CopySchedule orders by it).
  io::CopyPriority priority(const plan::Migration* planned) const;

  // Blocks until the transfer has finished, counting the wait as a stall of `op`. Does not
  // throw: the caller looks at the outcome.
  void await(const io::Transfer& transfer, OpIndex op, StallCause cause);
  void await(Entry& e, OpIndex op, StallCause cause) { await(e.transfer, op, cause); }
  void record_stall(OpIndex op, double start, double end, StallCause cause);
  // Waits out the entry's transfer, whose result nobody needs any more, and closes it; what
  // went wrong, if it failed.
  std::optional<std::string> wait_out(TensorId id, Entry& e, OpIndex op, StallCause cause);

  // Hands the entry's transfer over to the device (its device_side() must be set): the memory
  // of an offload is released behind its copy, a prefetched tensor may be used behind its copy.
  // The host retires the transfer later (retire_settled), when it sees it complete.
  void settle_on_device(TensorId id, Entry& e);

  static bool settles_on_device(const Entry& e) { return e.transfer.device_side() != nullptr; }

  // Finishes the entry's transfer as far as the operators are concerned: handed to the device
  // where it has a device side, else waited for and retired on the host.
  void complete(TensorId id, Entry& e, OpIndex op);

  // Retires one settled transfer the host has seen complete (or waits for it when `wait`).
  // Its failure concerns bytes the device already relied on, so it is returned to be raised.
  std::exception_ptr retire_settled(std::size_t index, std::optional<StallCause> wait, OpIndex op);

  // Waits for the settling transfers of one tensor: before its extent is read again or given back.
  std::exception_ptr settle(TensorId id, OpIndex op);

  // Retires a finished transfer. An offload frees the device memory; a prefetch frees the
  // extent. On failure the tensor stays where its bytes are valid and the error is rethrown.
  void finish(TensorId id, Entry& e);

  // An offload still in flight whose tensor is needed again: the device copy never stopped
  // being valid, so the copy out is dropped once the store is done with it.
  void take_back(TensorId id, Entry& e, OpIndex op);

  // Retires every finished transfer. A failure concerns a tensor that is already back where
  // its bytes are valid, so it is returned rather than thrown: the caller first finishes
  // making the operator's tensors resident.
  std::exception_ptr retire_completed();

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

  static void log_lost(std::exception_ptr failure);

  std::string over_budget(OpIndex op, std::uint64_t incoming, std::string_view why) const;

  // Stops tracking a tensor the program freed: its transfer in flight (if any) is waited for
  // and its extent released. Transfers already settled on the device are not waited for:
  // nobody needs their bytes any more, so they only give the extent back once the host sees
  // them done (and a failure of theirs is only logged).
  void forget(std::unordered_map<TensorId, Entry>::iterator found);

  // Forgets every tensor the program has freed; only needed when memory is short, so the
  // owner does not have to report frees operator by operator. `keep` stays even if freed: the
  // callers hold references to their entries (the program may free one from another thread).
  // Scans once per executor call (freed_swept).
  void forget_freed(std::span<const TensorId> keep = {});
  // The same, looking only at `released`.
  void forget_released(std::span<const TensorId> keep);
  // Whether forget_freed/forget_released may forget the tensor: the program freed it and no
  // caller holds its entry.
  bool forgettable(TensorId id, std::span<const TensorId> keep) const {
    return !memory.alive(id) && !executor_detail::contains_id(keep, id);
  }

  // What free_down_to throws when nothing more can be moved out.
  static bool no_room(const Error& error) {
    return error.kind() == ErrorKind::kInfeasible || error.kind() == ErrorKind::kTierFull;
  }

  // Outside kPassive, frees device memory until `incoming` more bytes fit the budget. `fetching`:
  // the bytes of the tensor about to be fetched (part of `incoming`), which may take a spare block.
  void make_room(OpIndex op, std::span<const TensorId> keep, std::uint64_t incoming,
                 std::uint64_t fetching = 0);

  // The idle tensor to evict, not one of `keep`: in a planned step the one used furthest ahead,
  // which is what the simulator evicts and the plan's model assumes; otherwise (no plan, or a
  // divergent step whose future the trace does not tell) the least recently used. `idle` is in
  // LRU order, so among equals the least recently used goes.
  std::optional<TensorId> pick_victim(OpIndex op, std::span<const TensorId> keep) const;

  // Whether the plan has tensor `id` off the device once operator `op`'s migrations are issued.
  bool plan_has_away(TensorId id, OpIndex op) const;
  // For the debug log of an eviction in a step that follows a plan: what the device holds that
  // the plan's memory at operator `op` does not (tensors the plan has away, tensors past their
  // profiled release, tensors the profile does not know), as "; against the plan: ...".
  std::string against_plan(OpIndex op) const;
  // The bytes on the device of the tensors the program holds past their profiled release at
  // operator `op` that the plan does not have away (against_plan's second share): few tensors,
  // `released` after make_room has forgotten the freed ones.
  std::uint64_t late_bytes(OpIndex op) const;

  // Frees device memory until resident + spare blocks + incoming <= limit: first by giving spare blocks
  // back (TensorMemory::spare_bytes; one of size `fetching` stays for that fetch), then by waiting
  // for offloads already under way, then by evicting the idle tensor pick_victim chooses.
  // Tensors in `keep` stay. An eviction no tier has room for waits for a prefetch to give its
  // extent back. Without `evict` it stops short of evicting: false when that is what is left.
  bool free_down_to(OpIndex op, std::span<const TensorId> keep, std::uint64_t incoming, std::uint64_t limit,
                    std::uint64_t fetching = 0, bool evict = true);
  // Waits for the first of the transfers that give an extent back when done (a prefetch, a
  // taken-back offload) to finish, and retires it; false when none is under way. Stall cause
  // kTierRoom.
  bool wait_for_tier_room(OpIndex op);

  // A fresh allocation for a fetch. The allocator may refuse one although the tracked tensors
  // are within the budget (memory TeraIO does not track, blocks too fragmented to join): then
  // it is asked again with the spare blocks given back (if any), then once more after as many
  // bytes again are moved out beyond the budget and the allocator's cached blocks go back to
  // the device; a refusal then is raised.
  void* allocate(TensorId id, Entry& e, std::span<const TensorId> keep);
  // memory.reallocate(id), or nullptr where the allocator refused it (logged).
  void* reallocate_unless_refused(TensorId id);

  void demand_fetch(TensorId id, Entry& e, OpIndex op, std::span<const TensorId> keep);

  void make_resident(TensorId id, Entry& e, OpIndex op, std::span<const TensorId> keep);

  void issue(const plan::Migration& migration, OpIndex op, std::span<const TensorId> used);

  // Waits for every transfer and retires it; rethrows the first failure (with
  // `keep_valid`, failures that left the bytes where they were valid are only logged).
  void drain(bool keep_valid = false);
};

}  // namespace teraio::runtime
