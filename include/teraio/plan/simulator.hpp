// plan/simulator: replays a trace with a plan on the hardware model to predict the step time
// and to check the plan. One compute stream runs the operators in order; four migration
// channels (PCIe device-to-host and host-to-device, SSD write and read) carry the transfers.
// It reports stalls, the memory curve against the budget, channel use, tier occupancy, and
// every broken invariant (it never throws for a bad plan: it says what is wrong with it).
//
// The model (docs/simulator.md):
//  - Migrations of operator k are issued when the compute stream reaches k (just before k
//    starts). Each channel serves one request at a time at its full bandwidth, plus the
//    per-request latency, always the most important one issued so far: urgent first, then
//    the earliest deadline, then issue order. A more important request issued later takes
//    the channel over at the next operator boundary (the runtime moves data in chunks).
//  - Without GPUDirect Storage an SSD transfer bounces through host memory in chunks: its
//    SSD leg and its PCIe leg (same direction) run at the same time on their channels and it
//    completes when both have, so SSD traffic occupies PCIe too. With GDS only the SSD channel.
//  - Before operator k starts, every migration whose deadline is k must be complete (the
//    compute stream stalls until then); an offload's deadline is where its memory is counted
//    as gone, so waiting for it keeps the budget hard.
//  - A tensor's device bytes are freed when its offload completes and allocated again when
//    its prefetch is issued. A tensor an operator needs that is not on the device is fetched
//    on demand (a stall and a violation). Step-local tensors exist from the start of their
//    first use to the end of their last use.
//  - With enforce_budget, an operator that would run over budget first waits for offloads in
//    flight and then evicts (see SimulationOptions): the time a plan's shortfall costs.
//  - Several consecutive steps are simulated; persistent tensors whose last migration in a
//    step is an offload start the first step offloaded (the steady state), and the last step
//    is the one reported.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan {

enum class Channel : std::uint8_t { kD2h, kH2d, kSsdWrite, kSsdRead };
inline constexpr std::size_t kChannelCount = 4;
std::string_view to_string(Channel channel);

enum class ViolationKind : std::uint8_t {
  kOverBudget,    // device memory above the budget
  kNotResident,   // an operator needed a tensor that was not on the device
  kHostOverCap,   // host tier above its capacity
  kSsdOverCap,    // SSD tier above its capacity
  kInconsistent,  // a migration that does not fit the tensor's state (offload of a tensor not on the device,
                  // ...)
};
inline constexpr std::size_t kViolationKindCount = 5;
std::string_view to_string(ViolationKind kind);

struct Violation {
  ViolationKind kind = ViolationKind::kOverBudget;
  std::size_t step = 0;
  trace::OpIndex op = 0;
  trace::TensorId tensor = 0;  // 0 where no single tensor is to blame
  std::uint64_t bytes = 0;     // memory over the limit, or the tensor's size
  std::string message;
};

struct SimulationOptions {
  std::size_t steps = 2;             // consecutive steps simulated; the last one is reported
  std::size_t max_violations = 200;  // violations kept in detail (all are counted)
  std::size_t top_stalls = 10;       // operators with the longest stalls to list
  bool record_timeline = false;      // keep the last step's spans for a timeline export
  // Keep the budget hard even under a plan that cannot (the runtime's reactive mode): before
  // an operator that would run over budget, wait for offloads in flight, then evict resident
  // tensors it does not use, farthest next use first, and fetch them back on demand. Time
  // spent so counts as stall; without it, over-budget operators are only reported.
  bool enforce_budget = false;
};

struct ChannelReport {
  double busy_s = 0;       // time spent serving requests in the reported step
  double utilization = 0;  // busy_s / step time
  std::uint64_t bytes = 0;
  std::uint64_t requests = 0;
};

struct OpStall {
  trace::OpIndex op = 0;
  double stall_s = 0;
};

// Spans of the reported step, with times relative to its start (seconds).
struct TimelineSpan {
  double start_s = 0, end_s = 0;
  std::uint32_t index = 0;  // operator index, or migration index in the plan (demand fetches: UINT32_MAX)
};
struct Timeline {
  std::vector<TimelineSpan> ops;
  std::array<std::vector<TimelineSpan>, kChannelCount> transfers;
  std::vector<std::pair<double, std::uint64_t>> memory;  // (time, device bytes) after each change
};

struct SimulationResult {
  std::size_t steps = 0;
  double step_time_s = 0;        // the reported (last) step
  double ideal_step_time_s = 0;  // sum of operator durations
  double stall_s = 0;
  double share_of_ideal = 0;  // ideal / step time
  std::vector<double> stall_per_op;
  std::vector<OpStall> top_stalls;
  std::uint64_t budget = 0;
  std::uint64_t peak_memory = 0;            // device bytes, reported step
  trace::OpIndex peak_op = 0;               // the first operator that starts with the most memory
  std::vector<std::uint64_t> memory_at_op;  // device bytes while each operator runs (at its start)
  std::array<ChannelReport, kChannelCount> channels{};
  // Bytes moved in the reported step: [tier][direction] with tier host=0/ssd=1, offload=0/prefetch=1.
  std::array<std::array<std::uint64_t, 2>, 2> tier_bytes{};
  std::uint64_t host_peak = 0, ssd_peak = 0;
  std::uint64_t demand_fetches = 0, demand_fetch_bytes = 0;
  std::uint64_t evictions = 0, eviction_bytes = 0;  // reactive evictions (enforce_budget)
  std::uint64_t skipped_migrations = 0;             // migrations that found nothing to do (reported step)
  // Offloads that only dropped device memory: the tier held an unchanged copy
  // (Migration::kept_copy, or an eviction of such a tensor).
  std::uint64_t dropped = 0, dropped_bytes = 0;
  std::array<std::uint64_t, kViolationKindCount> violation_counts{};  // all steps
  std::vector<Violation> violations;                                  // the first max_violations
  Timeline timeline;

  bool ok() const;
  std::size_t violation_count() const;
  // Multi-line human report (step, stalls, memory, channels, tiers, violations).
  std::string describe(const trace::Trace& trace) const;
};

// A lower bound on the step time that no plan can beat on `hardware`, from bandwidth alone.
// At an operator k with demand M[k] over the budget, X = M[k] - budget bytes of tensors k
// does not use must be off the device. Every tensor is used every step, so X bytes leave and
// return every step (X over the out and the in bandwidth). And each such tensor can only
// leave after its previous use and must be back before its next one: the X bytes released
// earliest (returned latest) give the least stall before (after) k that moving them at full
// bandwidth costs. The larger of the two is stall no plan avoids. Ignoring contention with
// other operators' traffic keeps it a bound. Out bandwidth is PCIe d2h, plus SSD write with
// GDS (without GDS SSD traffic crosses PCIe too); likewise in. Where the bytes due back after
// several operators (the peaks of successive micro-batches) must cross the incoming link in
// stretches of the step that do not overlap, each stretch needs its own link time: their
// stalls add up, and the largest such sum bounds the step too. The 256 operators most over
// budget and the 4 most over it in every run of operators over budget are examined. With
// pcie_duplex_bandwidth set, one operator's returns and a later one's departures that must
// cross in the stretch between them share that rate (plan/shared_link), which adds stretches.
struct StepBound {
  double ideal_s = 0;
  double bound_s = 0;             // >= ideal_s
  double max_share = 1;           // ideal_s / bound_s: the best share of ideal any plan can reach
  trace::OpIndex binding_op = 0;  // the operator that sets the bound (the first of `peaks`)
  std::size_t peaks = 1;          // operators whose stalls add up to the bound
  std::string reason;             // human-readable
};
StepBound step_time_bound(const trace::Trace& trace, const Hardware& hardware);

// Simulates `options.steps` steps of a single-step trace (a multi-step trace is cut to its
// first step) under `plan` on `hardware`. Throws Error{kInvalidArgument} only for an invalid
// trace, a negative latency, or a plan that names tensors the trace does not have, operators
// past its end, or a route whose bandwidth is 0 (channels no migration uses may be 0).
SimulationResult simulate(const trace::Trace& trace, const Plan& plan, const Hardware& hardware,
                          const SimulationOptions& options = {});

}  // namespace teraio::plan
