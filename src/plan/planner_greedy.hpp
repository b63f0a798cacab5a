// The greedy core of the planner (Algorithm 1 with a lazy priority queue) and the
// early-prefetch pass. make_plan() wraps it with validation, the plan records and the
// diagnosis.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan::detail {

// Where one inactive period goes and when, as offsets into its idle window (offset 0 is the
// operator after its last use; the window ends just before its next use). A period that ends
// in the tensor's release has no prefetch: prefetch_booked and prefetch_issue are its length.
struct Choice {
  Tier tier = Tier::kSsd;
  std::size_t offload_last = 0;     // offload completes during this offset
  std::size_t prefetch_booked = 0;  // first offset of the prefetch's booked bandwidth
  std::size_t prefetch_issue = 0;   // offset the prefetch is issued at (<= prefetch_booked)
  double score = 0;                 // benefit per byte moved (seconds of over-budget time)
  // The tier still holds an unchanged copy from the tensor's previous period moved out
  // (only read since): the device memory is dropped at offset 0 and nothing is copied out.
  bool clean = false;
};

struct Accepted {
  std::uint32_t period = 0;  // index into the periods given to run_greedy
  Choice choice;
  // The tensor's next period moved out is clean: its prefetch leaves the tier's copy in place.
  bool keeps_copy = false;
};

struct GreedyResult {
  std::vector<Accepted> accepted;
  std::vector<std::int64_t> demand_after;  // per operator, with the plan applied
  std::uint64_t host_peak = 0;
  std::uint64_t ssd_used = 0;
  std::size_t evaluations = 0;
  // Bytes/s the booking gives a prefetch from each tier (BandwidthLedger::rate of its route).
  double prefetch_rate_host = 0;
  double prefetch_rate_ssd = 0;
};

struct GreedyInput {
  const trace::Trace* trace = nullptr;
  const std::vector<trace::InactivePeriod>* periods = nullptr;
  std::vector<std::int64_t> demand;  // per operator, without migrations
  std::vector<double> start_s;       // op_start_times(trace)
  Hardware hardware;
  PlannerOptions options;
};

GreedyResult run_greedy(const GreedyInput& input);

// Shortest idle window (in operators) a migration fits in: one operator to offload during,
// one where the tensor is away, one to prefetch during.
inline constexpr std::uint32_t kMinIdleOps = 3;

// The smallest tensor the planner moves (PlannerOptions::min_migration_share of the budget,
// rounded up: a tensor under the share by a fraction of a byte stays too).
inline std::uint64_t smallest_moved_bytes(const Hardware& hardware, const PlannerOptions& options) {
  return static_cast<std::uint64_t>(
      std::ceil(options.min_migration_share * static_cast<double>(hardware.gpu_budget)));
}

// Whether a period of a tensor of `bytes` may move at all: long enough (kMinIdleOps), not
// smaller than `smallest`, and not empty (a tensor of 0 bytes frees nothing, and a migration
// of 0 bytes is not a valid plan entry).
inline bool movable(const trace::InactivePeriod& p, std::uint64_t bytes, std::uint64_t smallest) {
  return p.idle_ops >= kMinIdleOps && bytes > 0 && bytes >= smallest;
}

}  // namespace teraio::plan::detail
