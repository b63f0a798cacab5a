// plan/sweep: the paper's roofline study. For each migration bandwidth (and each budget),
// plan the trace with make_plan and simulate the plan; normalized performance is the ideal
// step time over the simulated one. The paper finds 32-48 GB/s per GPU near-ideal for
// large LLMs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan {

// How one bandwidth figure b is applied to the hardware:
//  kSsd (the paper's setting): every migration goes to the SSD tier over GPUDirect Storage at
//    b each way (SSD write = SSD read = b); the host tier is off; b is the per-GPU migration
//    bandwidth of each direction.
//  kAllChannels: PCIe d2h/h2d and SSD write/read are all set to b; tiers and GDS as in the base.
enum class SweepMode : std::uint8_t { kSsd, kAllChannels };
std::string_view to_string(SweepMode mode);
SweepMode parse_sweep_mode(std::string_view name);  // "ssd", "all"

// The hardware a sweep point runs on.
Hardware sweep_hardware(const Hardware& base, double bandwidth, SweepMode mode);

struct SweepOptions {
  std::vector<double> bandwidths;      // bytes/s
  std::vector<std::uint64_t> budgets;  // empty: the base hardware's budget
  Hardware base;
  SweepMode mode = SweepMode::kSsd;
  std::size_t steps = 2;  // simulated steps per point
};

struct SweepPoint {
  double bandwidth = 0;
  std::uint64_t budget = 0;
  bool feasible = false;  // the planner met the budget
  double step_time_s = 0;
  double ideal_step_time_s = 0;
  double normalized = 0;  // ideal / simulated step time
  double bound = 0;       // the best normalized performance any plan can reach (step_time_bound)
  double stall_s = 0;
  std::uint64_t peak_memory = 0;
  std::size_t migrations = 0;
  std::size_t violations = 0;
  double planning_s = 0;
};

// Points in (budget, bandwidth) order. A multi-step trace is cut to its first step.
std::vector<SweepPoint> sweep(const trace::Trace& trace, const SweepOptions& options);
// CSV with a header line: budget_bytes,budget_gib,bandwidth_gbps,feasible,step_s,ideal_s,normalized,bound,...
std::string sweep_to_csv(const std::vector<SweepPoint>& points);

}  // namespace teraio::plan
