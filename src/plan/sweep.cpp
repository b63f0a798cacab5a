#include "teraio/plan/sweep.hpp"

#include <cstdio>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {

std::string_view to_string(SweepMode mode) {
  return mode == SweepMode::kSsd ? "ssd" : "all";
}

SweepMode parse_sweep_mode(std::string_view name) {
  if (name == "ssd") return SweepMode::kSsd;
  if (name == "all") return SweepMode::kAllChannels;
  throw Error(ErrorKind::kInvalidArgument, cat("unknown sweep mode '", name, "' (ssd, all)"));
}

Hardware sweep_hardware(const Hardware& base, double bandwidth, SweepMode mode) {
  if (!(bandwidth > 0))
    throw Error(ErrorKind::kInvalidArgument, cat("sweep bandwidth must be positive: ", bandwidth));
  Hardware hw = base;
  hw.ssd_write_bandwidth = bandwidth;
  hw.ssd_read_bandwidth = bandwidth;
  if (mode == SweepMode::kSsd) {
    hw.gpudirect = true;
    hw.host_capacity = 0;
    // The study asks what bandwidth is needed, not what space: room is never the limit.
    if (hw.ssd_capacity == 0) hw.ssd_capacity = 1024 * kTiB;
  } else {
    // A shared cap scales with the link: the same share of the two directions' sum.
    if (hw.pcie_duplex_bandwidth > 0 && hw.d2h_bandwidth + hw.h2d_bandwidth > 0)
      hw.pcie_duplex_bandwidth *= 2 * bandwidth / (hw.d2h_bandwidth + hw.h2d_bandwidth);
    hw.d2h_bandwidth = bandwidth;
    hw.h2d_bandwidth = bandwidth;
  }
  return hw;
}

std::vector<SweepPoint> sweep(const trace::Trace& trace, const SweepOptions& options) {
  if (trace.step_begins.size() > 1) return sweep(trace::extract_step(trace, 0), options);
  std::vector<std::uint64_t> budgets = options.budgets;
  if (budgets.empty()) budgets.push_back(options.base.gpu_budget);
  PlannerOptions planner;
  planner.diagnosis_probes = 0;  // only feasibility matters here
  SimulationOptions sim;
  sim.steps = options.steps;
  sim.top_stalls = 0;
  sim.max_violations = 0;
  // A plan that misses the budget still has to run within it: its shortfall costs time.
  sim.enforce_budget = true;
  std::vector<SweepPoint> points;
  for (const std::uint64_t budget : budgets) {
    for (const double bw : options.bandwidths) {
      Hardware hw = sweep_hardware(options.base, bw, options.mode);
      hw.gpu_budget = budget;
      const PlanResult planned = make_plan(trace, hw, planner);
      const SimulationResult r = simulate(trace, planned.plan, hw, sim);
      SweepPoint p;
      p.bandwidth = bw;
      p.budget = budget;
      p.feasible = planned.plan.feasible;
      p.step_time_s = r.step_time_s;
      p.ideal_step_time_s = r.ideal_step_time_s;
      p.normalized = r.share_of_ideal;
      p.bound = step_time_bound(trace, hw).max_share;
      p.stall_s = r.stall_s;
      p.peak_memory = r.peak_memory;
      p.migrations = planned.plan.migrations.size();
      p.violations = r.violation_count();
      p.planning_s = planned.stats.planning_s;
      points.push_back(p);
    }
  }
  return points;
}

std::string sweep_to_csv(const std::vector<SweepPoint>& points) {
  std::string out =
      "budget_bytes,budget_gib,bandwidth_gbps,feasible,step_s,ideal_s,normalized,bound,stall_s,peak_bytes,"
      "migrations,violations,planning_s\n";
  for (const SweepPoint& p : points) {
    char line[512];
    std::snprintf(line, sizeof line, "%llu,%.3f,%.3f,%d,%.6f,%.6f,%.6f,%.6f,%.6f,%llu,%zu,%zu,%.4f\n",
                  static_cast<unsigned long long>(p.budget), double(p.budget) / double(kGiB),
                  p.bandwidth / 1e9, p.feasible ? 1 : 0, p.step_time_s, p.ideal_step_time_s, p.normalized,
                  p.bound, p.stall_s, static_cast<unsigned long long>(p.peak_memory), p.migrations,
                  p.violations, p.planning_s);
    out += line;
  }
  return out;
}

}  // namespace teraio::plan
