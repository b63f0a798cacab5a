// plan/planner: the I/O-bandwidth-aware migration planner (the paper's Algorithm 1, with the
// improvements documented in the README). Given a single-step trace and the hardware, it
// chooses which inactive periods to move out of device memory, to which tier, and when, so
// that peak memory fits the budget while every transfer fits the bandwidth that is left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan {

struct PlannerOptions {
  // Second pass that moves prefetches earlier while memory stays under budget, so that
  // timing jitter does not turn into stalls (G10's pass, dropped by the paper).
  bool early_prefetch = true;
};

// Why a budget cannot be met, when it cannot.
struct Diagnosis {
  bool feasible = false;
  std::uint64_t min_feasible_budget = 0;  // smallest budget at which a plan exists
  std::vector<trace::OpIndex> stuck_ops;  // operators whose memory cannot be brought down
  std::string message;                    // human-readable summary
};

struct PlanResult {
  Plan plan;
  Diagnosis diagnosis;
};

// Deterministic: the same inputs give the same plan. Never throws for an infeasible budget
// (the diagnosis says so); throws Error{kInvalidArgument} for an invalid trace or hardware.
PlanResult make_plan(const trace::Trace& trace, const Hardware& hardware, const PlannerOptions& options = {});

}  // namespace teraio::plan
