// plan/planner: the I/O-bandwidth-aware migration planner (the paper's Algorithm 1, with the
// improvements documented in docs/planner.md). Given a single-step trace and the hardware, it
// chooses which inactive periods to move out of device memory, to which tier, and when, so
// that peak memory fits the budget while every transfer fits the bandwidth that is left.
#pragma once

#include <cstddef>
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
  // How far earlier the pass may move a prefetch, as a multiple of its own transfer time;
  // bounded so that one prefetch does not take the memory headroom every other one could
  // use. 3 measured better than 1 and close to 10 under jitter (docs/planner.md); 100, where
  // memory bounds each prefetch, made profiled GPU traces' plans 1-2% faster and, with the
  // releases recorded, ran W3 2.7% and W2 @ 16 GiB 4.0% faster than 3 without them on the GPU
  // (bench/RESULTS.md, sessions 33 and 36).
  double early_prefetch_lead = 100.0;
  // Tensors smaller than this share of the GPU budget are never planned to move (1/65536:
  // 1.2 MiB at W3's 74 GiB, 16 bytes at a 1 MiB budget). They free next to nothing, and each
  // move costs a copy each way that the model books at its bytes plus one request latency,
  // while the GPU runtime served them late: W3's 1-of-32 plan moved 3 800 tensors under
  // 64 KiB (52 MiB a step), and the device waited 3.2 of its 6.2 s of copy waits at operators
  // where only such copies were due (bench/RESULTS.md, session 37). 0 moves any size.
  double min_migration_share = 1.0 / 65536;
  // Credit a migration only with the over-budget part of the memory it frees, per byte
  // moved: Σ τ[k]·min(size, M[k] − budget) / size over the operators it covers (bounded
  // above by min(Σ τ_over, Σ τ·excess / size)). Off: the paper's size × Σ τ[k] over the
  // over-budget operators, per byte. On helps where a big tensor would free far more than
  // is missing, but on the synthetic Llama traces it moved ~5% more bytes in ~20% more
  // migrations for the same smallest feasible budget (docs/planner.md): off by default.
  bool credit_over_budget_only = false;
  // Lazy greedy: a candidate whose fresh score is within this fraction of the best stored
  // score is taken without re-scoring the others. 0 is the exact greedy; a little slack
  // avoids re-scoring thousands of near-equal candidates after every choice.
  double score_tolerance = 0.25;
  // On an infeasible budget, search for the smallest feasible budget (each probe is one
  // planner run, the first at the peak this run reached, then bisection to within 0.4%);
  // at most this many probes, 0 disables the search (the unplanned peak is reported).
  int diagnosis_probes = 6;
  // Where no stall-free plan fits the budget (the paper's greedy stops there and leaves the
  // rest to reactive eviction), plan stalls instead: wait time is added to the step around the
  // operators still over budget, the greedy runs again on that slower step, and this repeats
  // up to stall_rounds times or until the plan fits; the plan with the shortest step that the
  // simulator predicts, holding the budget hard, is kept (the stall-free one included, so this
  // never predicts worse). 0 disables it. Single-step traces only.
  int stall_rounds = 64;
  // Share of the time the largest excess of each over-budget run needs at full bandwidth that
  // one round adds (more converges in fewer rounds; less plans fewer waits: docs/planner.md).
  double stall_damping = 0.5;
  // Rounds in a row with neither a shorter simulated step nor less left over the budget before
  // the stall search stops (each round costs a planner run and a simulation). A round that only
  // lowers the excess counts as progress: the plan that fits, shorter than any before it, can
  // come long after the last shorter one (W2's profiles, session 27).
  int stall_patience = 6;
};

// What the planner did, for reports and for comparing planner variants.
struct PlanStats {
  std::size_t periods = 0;           // inactive periods long and large enough to migrate in
  std::uint64_t smallest_moved = 0;  // bytes of the smallest tensor the plan may move (min_migration_share)
  std::size_t evaluations = 0;       // candidate (re)scorings: the greedy's work
  std::size_t offloads = 0;          // periods moved out (each gives an offload and a prefetch)
  std::size_t urgent = 0;            // migrations that must finish before the next operator
  std::uint64_t bytes_to_ssd = 0;    // per step
  std::uint64_t bytes_to_host = 0;   // per step
  // Offloads that drop the device memory because the tier kept an unchanged copy
  // (Migration::kept_copy), and their bytes per step: not in bytes_to_ssd or bytes_to_host.
  std::size_t clean_offloads = 0;
  std::uint64_t bytes_dropped = 0;
  std::uint64_t host_peak = 0;  // largest host-tier occupancy over the step
  std::uint64_t ssd_used = 0;   // SSD space: one extent per tensor sent there
  // Prefetch slack: time from issue to deadline minus the transfer time at the route's full
  // bandwidth. What the early-prefetch pass raises; stalls under jitter eat into it.
  double min_prefetch_slack_s = 0;
  double mean_prefetch_slack_s = 0;
  double planning_s = 0;  // wall time of make_plan, diagnosis included
  // The stall search (PlannerOptions::stall_rounds), when it ran: its rounds, the waits the
  // chosen plan was made for (0 when the stall-free plan stayed best), and the simulated
  // step (budget held hard) of the chosen and of the stall-free plan.
  int stall_rounds = 0;
  double planned_wait_s = 0;
  double simulated_step_s = 0;
  double stall_free_step_s = 0;
};

// Why a budget cannot be met without stalls, when it cannot (a plan with planned stalls may
// still fit it: Plan::feasible says whether the chosen plan's memory does).
struct Diagnosis {
  bool feasible = false;
  // Smallest budget at which a plan was found (PlannerOptions::diagnosis_probes); the
  // budget itself when it is feasible (not searched then).
  std::uint64_t min_feasible_budget = 0;
  // Operators whose memory cannot be brought down: those where what no plan can move
  // exceeds the budget when there are any, else those still over budget after planning.
  std::vector<trace::OpIndex> stuck_ops;
  std::string message;  // human-readable summary
};

struct PlanResult {
  Plan plan;
  Diagnosis diagnosis;
  PlanStats stats;
};

// Throws Error{kInvalidArgument} naming the first option out of range (stall_rounds < 0,
// stall_patience < 1, early_prefetch_lead not a number >= 0, min_migration_share outside
// [0, 1)). make_plan calls it; a caller that takes options long before it plans (teraio.Session)
// calls it up front.
void check_options(const PlannerOptions& options);

// Deterministic: the same inputs give the same plan. Never throws for an infeasible budget
// (the diagnosis says so); throws Error{kInvalidArgument} for an invalid trace or hardware.
// The trace is planned as one repeating unit (a multi-step trace: extract one step first
// with trace::extract_step). Costs O((ops + uses) log ops) per run in practice.
PlanResult make_plan(const trace::Trace& trace, const Hardware& hardware, const PlannerOptions& options = {});

}  // namespace teraio::plan
