// runtime/executor: carries a migration plan out against live tensors, step after step. Before
// each operator it issues the migrations the plan schedules there (urgent ones first) through
// the tier store, and makes the tensors the operator uses resident: it waits for their
// prefetches, fetches on demand what a wrong plan left out (counted), and takes back an offload
// still in flight. Device memory is released only once the copy out has completed. Where a
// transfer's device side is one enqueued copy (host tier on CUDA), those waits are handed to the
// device (TensorMemory::release_after / use_after) and the host only later sees the transfer
// done ("settling"); otherwise the operator thread waits (a stall). Without a
// plan (profiling, divergence) a reactive mode holds the budget: the least recently used idle
// tensor is evicted when tracked memory exceeds it. Where a plan leaves a step over the budget,
// the same eviction takes the idle tensor used furthest ahead instead (NextUses, from the
// profiled trace). Single operator thread; no torch here.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/io/tier_store.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/runtime/next_use.hpp"
#include "teraio/runtime/tensor_memory.hpp"

namespace teraio::runtime {

// Where a tracked tensor's bytes are.
enum class Location : std::uint8_t {
  kDevice,      // resident, nothing in flight
  kOffloading,  // resident, copy out in flight
  kHost,        // offloaded to the pinned host tier
  kSsd,         // offloaded to the SSD tier
  kFetching,    // fresh allocation, copy in flight
};
std::string_view to_string(Location location);

enum class Mode : std::uint8_t {
  kPassive,   // no plan, no eviction: only demand fetches (outside steps, fitting models)
  kReactive,  // evict the least recently used idle tensor while over budget
  kPlanned,   // carry out the plan (and still evict if over budget: furthest next use first)
};
std::string_view to_string(Mode mode);

struct ExecutorConfig {
  // Device memory that tracked tensors may hold, in bytes; 0: unlimited.
  std::uint64_t budget = 0;
};

// One transfer, for the timeline (seconds since the executor was created).
struct TransferSpan {
  TensorId tensor = 0;
  plan::Direction direction = plan::Direction::kOffload;
  plan::Tier tier = plan::Tier::kSsd;
  std::uint64_t bytes = 0;
  bool planned = true;  // false: reactive eviction or demand fetch
  double start_s = 0;   // submitted
  double end_s = 0;     // seen complete
};

// Why the operator thread waited on the host (waits handed to the device are not stalls here).
enum class StallCause : std::uint8_t {
  kTransfer,  // a transfer without a device side (SSD bounce path, host copies not enqueued)
  kOrdering,  // a copy out the host had not seen finish, before the same bytes are read again
  kTakeBack,  // an offload without a device side, of a tensor needed again
  kForget,    // a transfer of a tensor the program freed
  kDrain,     // every transfer, at the end of a step or on close
  kTierRoom,  // a prefetch still holding its extent, when an eviction found no tier with room
};
inline constexpr std::size_t kStallCauseCount = 6;
std::string_view to_string(StallCause cause);

// The operator thread waiting for transfers before an operator.
struct StallSpan {
  OpIndex op = 0;
  double start_s = 0;
  double end_s = 0;
  StallCause cause = StallCause::kTransfer;
};

// The phases of Executor::before_op, in order.
enum class BeforeOpPart : std::size_t {
  kRetire,    // settled transfers retired, their memory and extents released
  kIssue,     // the plan's migrations for the operator issued (allocations for prefetches included)
  kResident,  // the operator's tensors made resident: demand fetches, take-backs, waits
  kRoom,      // room made for its outputs: evictions
};
inline constexpr std::size_t kBeforeOpParts = 4;
std::string_view to_string(BeforeOpPart part);

struct StepStats {
  std::uint64_t step = 0;  // counts begin_step() calls from 0
  Mode mode = Mode::kPassive;
  double stall_s = 0;                                       // operator thread waiting on transfers
  std::array<double, kStallCauseCount> stall_by_cause_s{};  // stall_s by StallCause
  std::uint64_t planned_offloads = 0;                       // issued
  std::uint64_t planned_prefetches = 0;                     // issued
  std::uint64_t demand_fetches = 0;  // tensor used while not resident (wrong or no plan)
  std::uint64_t evictions = 0;       // reactive offloads
  // Evictions of a planned step that the program's late frees account for: the tensors it holds
  // past their profiled release (and the plan does not have away) cover the shortfall. A plan
  // made without recorded releases (Session(record_releases=False)) counts them free at their
  // last use; with the releases recorded it does not.
  std::uint64_t late_free_evictions = 0;
  // Offloads before a planned step's first operator that bring the device to the plan's start
  // (the first planned step after a reactive one, or after a new plan): tensors the plan has
  // away at every step's start that were still on the device.
  std::uint64_t positioned = 0;
  // Fetches before that first operator, the other half of positioning: persistent tensors the
  // plan has on the device at every step's start that the step before left away (a reactive
  // step's evictions), in the order of their first use, as far as the budget has room. Also
  // counts those whose copy out was still running: taken back (cancelled_offloads), not fetched.
  std::uint64_t positioned_back = 0;
  // Tensor used, prefetched or positioned back while its copy out ran.
  std::uint64_t cancelled_offloads = 0;
  // Bytes of those copies out that were dropped before they started (TensorMemory::
  // cancel_copy_out). They are in bytes_to_host/ssd, which count copies when issued.
  std::uint64_t bytes_abandoned = 0;
  // Waits handed to the device (TensorMemory::release_after / use_after) instead of the host:
  // the GPU time they cost is not in stall_s (the torch binding measures it on CUDA).
  std::uint64_t device_waits = 0;
  std::uint64_t skipped = 0;  // planned migration not possible: tensor unknown, tier full, wrong state
  // Offloads (planned or evictions) that only dropped device memory because the tensor's
  // extent kept an unchanged copy (plan::Migration::kept_copy): not in bytes_to_*.
  std::uint64_t dropped = 0;
  std::uint64_t bytes_dropped = 0;
  // Kept copies given back because a tier had no room for a tensor that had to leave.
  std::uint64_t copies_given_up = 0;
  // Fetches whose allocation the device refused at first (memory TeraIO does not track, or
  // fragmentation): tensors were moved out beyond the budget and the allocation retried.
  std::uint64_t allocation_retries = 0;
  // Scans of every tracked tensor for ones the program freed (memory short, see make_room),
  // and their host time: at most one per executor call, since frees happen between calls.
  std::uint64_t freed_scans = 0;
  double freed_scan_s = 0;
  std::uint64_t bytes_to_host = 0;
  std::uint64_t bytes_from_host = 0;
  std::uint64_t bytes_to_ssd = 0;
  std::uint64_t bytes_from_ssd = 0;
  std::uint64_t peak_resident = 0;  // highest tracked bytes holding device memory
  // Host time in before_op() by phase (BeforeOpPart): where the operator thread's time goes
  // when the GPU waits for it.
  std::array<double, kBeforeOpParts> before_op_s{};
  std::vector<TransferSpan> transfers;
  std::vector<StallSpan> stalls;
};

class Executor {
 public:
  // The store and memory outlive the executor.
  Executor(io::TierStore& store, TensorMemory& memory, ExecutorConfig config);
  // Waits for transfers in flight (errors swallowed and logged) and releases every extent.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Indexes the plan's migrations by operator; replaces any earlier plan. Does not change mode.
  void set_plan(const plan::Plan& plan);
  // When each tensor is used next in the planned step. In kPlanned, eviction then takes the idle
  // tensor used furthest ahead (least recently used among equals); without them, or in
  // kReactive, the least recently used one.
  void set_next_uses(NextUses next_uses);
  void set_mode(Mode mode);
  Mode mode() const;
  std::uint64_t budget() const;

  // A tensor that holds memory now (just produced, or first seen). Throws Error{kInvalidArgument}
  // if the id is already tracked.
  void add_tensor(TensorId id, std::uint64_t bytes);
  // The program freed the tensor: waits for its transfer in flight (if any), releases its
  // extent, stops counting it. Unknown ids are ignored.
  void remove_tensor(TensorId id);
  bool contains(TensorId id) const;
  Location location(TensorId id) const;  // Error{kInvalidArgument} for an unknown id
  std::uint64_t resident_bytes() const;  // tracked bytes holding device memory now
  std::size_t tensor_count() const;
  // True while the tensor's transfer holds its device memory (kOffloading or kFetching); false
  // for unknown ids.
  bool in_flight(TensorId id) const;
  // Grows whenever a tensor leaves kOffloading or kFetching (or is removed in flight): while it
  // is unchanged, in_flight() is unchanged for every tensor that was in flight.
  std::uint64_t settled_changes() const;

  void begin_step();
  // At the start of a planned step, before its first operator: sends out the tensors the plan
  // (set_plan) has away at every step's start that are still on the device, as evictions are
  // sent (urgent). Only persistent ones count (NextUses::persistent, as in the simulator's
  // steady state; none without set_next_uses): a step-local tensor alive at the step's start is
  // an older storage whose id a new one takes over. Call it on the first step of a new plan: a
  // step after a reactive one, or after another plan, otherwise starts with memory the plan gave
  // to its first operators. Then fetches, in the order of their first use and as far as the
  // budget has room without evicting (offloads under way count as done), the persistent tensors
  // the plan has on the device at the start that are away: a reactive step leaves its evictions
  // out, and each would otherwise be fetched on demand by the first micro-batch. One still on
  // its way out is taken back instead: its memory still counts, and nothing is fetched (where
  // the copy out has no device-side event, the host first waits for it to end). Returns how
  // many moved (StepStats::positioned + positioned_back); throws Error{kInvalidArgument} outside
  // a planned step.
  std::uint64_t position_for_plan();
  // Before operator k of the step: retires completed transfers (releasing the memory of
  // finished offloads), issues the plan's migrations for k (kPlanned; urgent first), makes
  // every tensor in `used` resident (unknown ids ignored), marks them used at k, and in
  // kReactive/kPlanned evicts idle tensors until resident bytes plus `incoming_bytes` (what
  // the operator is expected to allocate: its outputs, as profiled) fit the budget. A transfer
  // failure is rethrown as teraio::Error; the tensor stays where its bytes are valid.
  void before_op(OpIndex k, std::span<const TensorId> used, std::uint64_t incoming_bytes = 0);
  // After operator k: retires completed transfers and, outside kPassive, evicts idle tensors
  // (not in `used`) until resident bytes fit the budget again.
  void after_op(OpIndex k, std::span<const TensorId> used);
  // The operator about to run (or just run) changes these tensors' bytes on the device: copies
  // kept off it (plan::Migration::kept_copy) are stale, and their extents go back. Unknown ids
  // are ignored. The caller says so for every write it sees; a copy is only ever dropped to
  // when no write came between.
  void written(std::span<const TensorId> ids);
  // Whether the tensor is on the device with an unchanged copy kept in a tier.
  bool copy_kept(TensorId id) const;
  // Closes the step's statistics; transfers in flight carry on into the next step.
  StepStats end_step();

  // Makes tensors resident now (demand fetch, counted), outside the plan.
  void fetch(std::span<const TensorId> ids);
  // The same, never evicting the tensors in `keep` to make room (an operator still uses them).
  void fetch(std::span<const TensorId> ids, std::span<const TensorId> keep);
  // Makes every tracked tensor resident; throws Error{kInfeasible} naming the shortfall,
  // before moving anything, when they cannot all fit the budget.
  void fetch_all();
  // Waits for every transfer in flight and retires it.
  void drain();
  // The same, where a failed transfer that left its tensor's bytes valid (a copy that did not
  // settle on the device: the tensor stays where it was) is only logged: for bringing every
  // tensor back after a step already failed. A failure that lost bytes is still rethrown.
  void drain_keeping_valid();

  // Seconds since construction, on the clock the spans use.
  double now_s() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace teraio::runtime
