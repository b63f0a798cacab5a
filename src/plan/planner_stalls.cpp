// The stall search: where the bandwidth cannot hide every migration that the budget needs, the
// stall-free greedy leaves operators over budget and the runtime would evict and fetch on
// demand, blind to next uses. Instead, waits are planned into the step where memory is short,
// which gives the transfers the time they lack, and the greedy runs again on that slower step.
// The runtime then waits at the plan's deadlines for exactly the transfers the plan chose.
#include <algorithm>
#include <numeric>

#include "planner_run.hpp"
#include "stall_patience.hpp"
#include "teraio/plan/simulator.hpp"

namespace teraio::plan::detail {
namespace {

// Adds waits around every run of operators still over budget: the time the run's largest
// excess takes to leave at full bandwidth, scaled by `damping` (the greedy overshoots when
// given all of it at once). A third goes just before the run, for offloads due at its start;
// a third after its first operator past it, for prefetches issued after the run; a third inside,
// for tensors whose idle period begins or ends within it.
void add_waits(const std::vector<std::int64_t>& demand_after, std::int64_t budget, double out_rate,
               double damping, std::vector<double>& wait_after_s) {
  const std::size_t n = demand_after.size();
  for (std::size_t a = 0; a < n;) {
    if (demand_after[a] <= budget) {
      ++a;
      continue;
    }
    std::size_t b = a;
    std::int64_t excess = demand_after[a] - budget;
    while (b + 1 < n && demand_after[b + 1] > budget) excess = std::max(excess, demand_after[++b] - budget);
    const double wait = damping * static_cast<double>(excess) / out_rate;
    wait_after_s[a == 0 ? n - 1 : a - 1] += wait / 3;
    // A prefetch issued before operator k is counted from k on and moves during k's span:
    // the operator after the run is the first whose span it can use without raising the run.
    wait_after_s[(b + 1) % n] += wait / 3;
    const double inside = wait / 3 / static_cast<double>(b - a + 1);
    for (std::size_t k = a; k <= b; ++k) wait_after_s[k] += inside;
    a = b + 1;
  }
}

// Over-budget bytes summed over the operators: what a round has to bring down.
std::int64_t total_excess(const std::vector<std::int64_t>& demand_after, std::int64_t budget) {
  std::int64_t total = 0;
  for (const std::int64_t m : demand_after) total += std::max<std::int64_t>(0, m - budget);
  return total;
}

}  // namespace

PlanResult plan_with_stalls(const Prepared& prep, const Hardware& hw, const PlannerOptions& options,
                            PlanResult stall_free, std::vector<std::int64_t> demand_after) {
  const trace::Trace& trace = *prep.trace;
  SimulationOptions replay;
  replay.enforce_budget = true;  // as the runtime runs a plan that does not fit: wait, then evict
  const auto simulated_step = [&](const Plan& plan) { return simulate(trace, plan, hw, replay).step_time_s; };

  PlanResult best = std::move(stall_free);
  best.stats.stall_free_step_s = best.stats.simulated_step_s = simulated_step(best.plan);
  const double out_rate = hw.d2h_bandwidth + (hw.gpudirect ? hw.ssd_write_bandwidth : 0);
  if (!(out_rate > 0)) return best;
  Prepared slower = prep;
  std::vector<double> wait_after_s(trace.ops.size(), 0.0);
  const auto budget = static_cast<std::int64_t>(hw.gpu_budget);
  // The excess understates the waits where the tensors that can leave are larger than it:
  // while a round brings the total excess no lower, the next adds twice as much.
  double scale = options.stall_damping;
  std::int64_t excess = total_excess(demand_after, budget);
  StallPatience patience(options.stall_patience, best.stats.simulated_step_s, excess);
  int rounds = 0;
  for (bool fits = false; !fits && rounds < options.stall_rounds && !patience.exhausted();) {
    add_waits(demand_after, budget, out_rate, scale, wait_after_s);
    retime(slower, wait_after_s);
    PlanResult round = plan_once(slower, hw, options, &demand_after);
    ++rounds;
    fits = round.plan.feasible;
    const std::int64_t now_excess = total_excess(demand_after, budget);
    scale = now_excess < excess ? options.stall_damping : 2 * scale;
    excess = now_excess;
    const double step = simulated_step(round.plan);
    if (patience.shorter(step, now_excess)) {
      // What the stall-free run found stays: its diagnosis and its simulated step.
      round.diagnosis = std::move(best.diagnosis);
      round.stats.stall_free_step_s = best.stats.stall_free_step_s;
      round.stats.simulated_step_s = step;
      round.stats.planned_wait_s = std::accumulate(wait_after_s.begin(), wait_after_s.end(), 0.0);
      best = std::move(round);
    }
  }
  best.stats.stall_rounds = rounds;
  return best;
}

}  // namespace teraio::plan::detail
