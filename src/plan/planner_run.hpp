// One greedy planner run and what it needs, shared by make_plan(), its diagnosis probes and
// the stall search (internal to plan/).
#pragma once

#include <cstdint>
#include <vector>

#include "teraio/plan/planner.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan::detail {

// Everything a planner run needs that does not depend on the budget, computed once and
// shared by the diagnosis probes.
struct Prepared {
  const trace::Trace* trace = nullptr;
  std::vector<double> start_s;  // op_start_times, or as retime() set them
  std::vector<trace::InactivePeriod> periods;
  std::vector<std::int64_t> demand;
  std::uint64_t peak_before = 0;
};

Prepared prepare(const trace::Trace& trace);

// Plans as if the step waited `wait_after_s[k]` seconds after operator k (one per operator):
// the transfers get that time, the operators' memory does not change.
void retime(Prepared& prep, const std::vector<double>& wait_after_s);

// The greedy at one budget, without diagnosis. `demand_after` (optional) receives the memory
// demand per operator with the plan applied.
PlanResult plan_once(const Prepared& prep, const Hardware& hw, const PlannerOptions& options,
                     std::vector<std::int64_t>* demand_after = nullptr);

// Where no stall-free plan fits (`stall_free` is the plan_once result at hw's budget, with
// its demand per operator): plans waits into the step, round by round, and keeps the plan the
// simulator, holding the budget hard, runs fastest (PlannerOptions::stall_rounds). The result
// keeps the stall-free run's diagnosis.
PlanResult plan_with_stalls(const Prepared& prep, const Hardware& hw, const PlannerOptions& options,
                            PlanResult stall_free, std::vector<std::int64_t> demand_after);

}  // namespace teraio::plan::detail
