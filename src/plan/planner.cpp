#include "teraio/plan/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <tuple>

#include "circular.hpp"
#include "input_checks.hpp"
#include "planner_greedy.hpp"
#include "planner_run.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace detail {

Prepared prepare(const trace::Trace& trace) {
  Prepared p;
  p.trace = &trace;
  p.start_s = trace::op_start_times(trace);
  p.periods = trace::inactive_periods(trace, p.start_s);
  const std::vector<std::uint64_t> demand = trace::memory_demand(trace);
  p.demand.assign(demand.begin(), demand.end());
  for (std::uint64_t m : demand) p.peak_before = std::max(p.peak_before, m);
  return p;
}

void retime(Prepared& prep, const std::vector<double>& wait_after_s) {
  const trace::Trace& trace = *prep.trace;
  for (std::size_t k = 0; k < trace.ops.size(); ++k)
    prep.start_s[k + 1] = prep.start_s[k] + trace.ops[k].duration_s + wait_after_s[k];
  prep.periods = trace::inactive_periods(trace, prep.start_s);
}

PlanResult plan_once(const Prepared& prep, const Hardware& hw, const PlannerOptions& options,
                     std::vector<std::int64_t>* demand_after) {
  const trace::Trace& trace = *prep.trace;
  const std::size_t n = trace.ops.size();
  PlanResult result;
  Plan& plan = result.plan;
  plan.hardware = hw;
  plan.peak_before = prep.peak_before;
  const std::uint64_t smallest = detail::smallest_moved_bytes(hw, options);
  result.stats.smallest_moved = smallest;
  for (const trace::InactivePeriod& p : prep.periods)
    result.stats.periods += detail::movable(p, trace.tensors[p.tensor].bytes, smallest);
  if (n == 0) {
    plan.feasible = result.diagnosis.feasible = true;
    if (demand_after != nullptr) demand_after->clear();
    return result;
  }
  detail::GreedyInput input{&trace, &prep.periods, prep.demand, prep.start_s, hw, options};
  const detail::GreedyResult greedy = detail::run_greedy(input);

  PlanStats& stats = result.stats;
  stats.evaluations = greedy.evaluations;
  stats.offloads = greedy.accepted.size();
  stats.host_peak = greedy.host_peak;
  stats.ssd_used = greedy.ssd_used;
  stats.min_prefetch_slack_s = std::numeric_limits<double>::infinity();
  double slack_sum = 0;
  std::size_t prefetches = 0;
  plan.migrations.reserve(2 * greedy.accepted.size());
  for (const detail::Accepted& a : greedy.accepted) {
    const trace::InactivePeriod& p = prep.periods[a.period];
    const trace::Tensor& t = trace.tensors[p.tensor];
    const Choice& c = a.choice;
    const Window w{(static_cast<std::size_t>(p.last_use) + 1) % n, p.idle_ops};
    const auto op = [&](std::size_t offset) {
      return static_cast<trace::OpIndex>(detail::op_at(n, w, offset));
    };
    // A clean offload copies nothing: it is done the moment it is issued.
    const Migration off{t.id,
                        t.bytes,
                        Direction::kOffload,
                        c.tier,
                        op(0),
                        op(c.offload_last + 1),
                        c.offload_last == 0 && !c.clean,
                        c.clean};
    plan.migrations.push_back(off);
    stats.urgent += off.urgent;
    if (c.clean) {
      ++stats.clean_offloads;
      stats.bytes_dropped += t.bytes;
    } else {
      (c.tier == Tier::kSsd ? stats.bytes_to_ssd : stats.bytes_to_host) += t.bytes;
    }
    if (p.released) continue;  // freed while away: nothing comes back
    const Migration pre{t.id,
                        t.bytes,
                        Direction::kPrefetch,
                        c.tier,
                        op(c.prefetch_issue),
                        p.next_use,
                        c.prefetch_issue + 1 == p.idle_ops,
                        a.keeps_copy};
    plan.migrations.push_back(pre);
    stats.urgent += pre.urgent;
    ++prefetches;
    const double slack = p.idle_s - detail::time_at(prep.start_s, w, c.prefetch_issue) -
                         (static_cast<double>(t.bytes) /
                              (c.tier == Tier::kSsd ? greedy.prefetch_rate_ssd : greedy.prefetch_rate_host) +
                          hw.request_latency_s);
    stats.min_prefetch_slack_s = std::min(stats.min_prefetch_slack_s, slack);
    slack_sum += slack;
  }
  if (prefetches == 0)
    stats.min_prefetch_slack_s = 0;
  else
    stats.mean_prefetch_slack_s = slack_sum / static_cast<double>(prefetches);
  std::sort(plan.migrations.begin(), plan.migrations.end(), [](const Migration& a, const Migration& b) {
    return std::tie(a.issue_before, a.tensor, a.direction) < std::tie(b.issue_before, b.tensor, b.direction);
  });
  std::int64_t peak = 0;
  for (std::int64_t m : greedy.demand_after) peak = std::max(peak, m);
  if (demand_after != nullptr) *demand_after = greedy.demand_after;
  plan.peak_after = static_cast<std::uint64_t>(peak);
  plan.feasible = plan.peak_after <= hw.gpu_budget;
  result.diagnosis.feasible = plan.feasible;
  result.diagnosis.min_feasible_budget = plan.feasible ? hw.gpu_budget : 0;
  if (!plan.feasible)
    for (std::size_t k = 0; k < n; ++k)
      if (static_cast<std::uint64_t>(greedy.demand_after[k]) > hw.gpu_budget)
        result.diagnosis.stuck_ops.push_back(static_cast<trace::OpIndex>(k));
  return result;
}

}  // namespace detail

namespace {

using detail::plan_once;
using detail::prepare;
using detail::Prepared;

using detail::Choice;
using detail::Window;

void check_inputs(const trace::Trace& trace, const Hardware& hw) {
  detail::require_plannable(trace, "make_plan");
  if (hw.gpu_budget == 0) throw Error(ErrorKind::kInvalidArgument, "make_plan: the GPU memory budget is 0");
  if (hw.gpu_budget > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    throw Error(ErrorKind::kInvalidArgument,
                cat("make_plan: the GPU memory budget ", hw.gpu_budget, " bytes is out of range"));
  const std::pair<const char*, double> rates[] = {{"d2h_bandwidth", hw.d2h_bandwidth},
                                                  {"h2d_bandwidth", hw.h2d_bandwidth},
                                                  {"pcie_duplex_bandwidth", hw.pcie_duplex_bandwidth},
                                                  {"ssd_write_bandwidth", hw.ssd_write_bandwidth},
                                                  {"ssd_read_bandwidth", hw.ssd_read_bandwidth},
                                                  {"request_latency_s", hw.request_latency_s}};
  for (const auto& [name, value] : rates)
    if (!std::isfinite(value) || value < 0)
      throw Error(ErrorKind::kInvalidArgument,
                  cat("make_plan: hardware ", name, " = ", value, " is not >= 0"));
}

// Whether any tier has room and bandwidth both ways; without one, nothing can move.
bool any_tier_usable(const Hardware& hw) {
  const bool host = hw.host_capacity > 0 && hw.d2h_bandwidth > 0 && hw.h2d_bandwidth > 0;
  const bool ssd = hw.ssd_capacity > 0 && hw.ssd_write_bandwidth > 0 && hw.ssd_read_bandwidth > 0 &&
                   (hw.gpudirect || (hw.d2h_bandwidth > 0 && hw.h2d_bandwidth > 0));
  return host || ssd;
}

// Per operator, the memory no plan can move: everything except tensors idle around it long
// enough to be offloaded before and prefetched after it and large enough to be moved at all
// (min_migration_share; needs at least one usable tier).
std::vector<std::int64_t> memory_floor(const Prepared& prep, const Hardware& hw,
                                       const PlannerOptions& options) {
  const std::size_t n = prep.demand.size();
  std::vector<std::int64_t> floor = prep.demand;
  if (!any_tier_usable(hw)) return floor;
  std::vector<std::int64_t> diff(n + 1, 0);
  const std::uint64_t smallest = detail::smallest_moved_bytes(hw, options);
  for (const trace::InactivePeriod& p : prep.periods) {
    if (!detail::movable(p, prep.trace->tensors[p.tensor].bytes, smallest)) continue;
    const auto s = static_cast<std::int64_t>(prep.trace->tensors[p.tensor].bytes);
    const Window w{(static_cast<std::size_t>(p.last_use) + 1) % n, p.idle_ops};
    // Away from the operator after the offload's to the one before the prefetch's, or to the
    // window's end when the tensor is freed there.
    for (const detail::Segment& seg : detail::segments(n, w, 1, p.idle_ops - (p.released ? 0 : 1))) {
      diff[seg.op_begin] += s;
      diff[seg.op_end] -= s;
    }
  }
  std::int64_t movable = 0;
  for (std::size_t k = 0; k < n; ++k) {
    movable += diff[k];
    floor[k] -= movable;
  }
  return floor;
}

std::string describe_op(const trace::Trace& trace, trace::OpIndex k) {
  return cat(k, " (", trace.ops[k].name, ")");
}

void diagnose(const Prepared& prep, const Hardware& hw, const PlannerOptions& options, PlanResult& result) {
  Diagnosis& d = result.diagnosis;
  const trace::Trace& trace = *prep.trace;
  const std::vector<std::int64_t> floor = memory_floor(prep, hw, options);
  std::int64_t hard = 0;
  std::size_t worst = 0;
  for (std::size_t k = 0; k < floor.size(); ++k)
    if (floor[k] > hard) hard = floor[k], worst = k;
  const auto budget = static_cast<std::int64_t>(hw.gpu_budget);
  if (hard > budget) {
    d.stuck_ops.clear();
    for (std::size_t k = 0; k < floor.size(); ++k)
      if (floor[k] > budget) d.stuck_ops.push_back(static_cast<trace::OpIndex>(k));
  }

  // Binary search between the last budget known infeasible and one known feasible (the
  // peak without migrations). Greedy feasibility is close to monotone in the budget.
  std::uint64_t lo =
      std::max<std::uint64_t>(hw.gpu_budget, static_cast<std::uint64_t>(std::max<std::int64_t>(hard, 1) - 1));
  std::uint64_t hi = prep.peak_before;
  // The peak this run reached is usually just feasible itself: probing it first narrows
  // the search to the interesting range with one run.
  std::uint64_t guess = std::max(result.plan.peak_after, lo + 1);
  PlannerOptions probe_options = options;
  // The pass only adds memory where it stays under budget: it cannot change feasibility.
  // Everything else stays as asked, so that the budget reported is feasible as planned.
  probe_options.early_prefetch = false;
  // Without a usable tier no budget below the unplanned peak is feasible: nothing to search.
  const int probes = any_tier_usable(hw) ? options.diagnosis_probes : 0;
  for (int probe = 0; probe < probes && hi - lo > std::max<std::uint64_t>(1, hi / 256); ++probe) {
    const std::uint64_t mid = guess < hi ? guess : lo + (hi - lo) / 2;
    guess = hi;
    Hardware probe_hw = hw;
    probe_hw.gpu_budget = mid;
    (plan_once(prep, probe_hw, probe_options).plan.feasible ? hi : lo) = mid;
  }
  d.min_feasible_budget = hi;

  const std::size_t shown = d.stuck_ops.empty() ? 0 : d.stuck_ops.front();
  if (!any_tier_usable(hw)) {
    // Said first: otherwise the message below blames the tensors' lifetimes.
    d.message =
        cat("no tier can take tensors (host tier and SSD tier both have capacity 0 or a channel "
            "of bandwidth 0), so nothing can move: ",
            d.stuck_ops.size(), " operators are over the budget ", format_bytes(hw.gpu_budget),
            " (first: operator ", describe_op(trace, static_cast<trace::OpIndex>(shown)),
            "); enable a tier or raise the budget to ", format_bytes(d.min_feasible_budget));
  } else if (hard > budget) {
    d.message = cat("budget ", format_bytes(hw.gpu_budget), " is below what ", d.stuck_ops.size(),
                    " operators must hold on the GPU (first: operator ",
                    describe_op(trace, static_cast<trace::OpIndex>(shown)), "; worst: operator ",
                    describe_op(trace, static_cast<trace::OpIndex>(worst)), " needs ",
                    format_bytes(static_cast<std::uint64_t>(hard)),
                    " in tensors it uses, untracked memory, tensors idle too briefly to move and tensors "
                    "under min_migration_share of the budget); "
                    "smallest feasible budget about ",
                    format_bytes(d.min_feasible_budget));
  } else {
    d.message = cat("the migration bandwidth cannot bring ", d.stuck_ops.size(),
                    " operators under the budget ", format_bytes(hw.gpu_budget), " (first: operator ",
                    describe_op(trace, static_cast<trace::OpIndex>(shown)), "; peak after planning ",
                    format_bytes(result.plan.peak_after), "); smallest feasible budget about ",
                    format_bytes(d.min_feasible_budget), ", or add bandwidth or tier capacity");
  }
}

}  // namespace

void check_options(const PlannerOptions& options) {
  if (options.stall_rounds < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("stall_rounds must be >= 0 (got ", options.stall_rounds, ")"));
  }
  if (options.stall_patience < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("stall_patience must be >= 1 (got ", options.stall_patience, ")"));
  }
  if (!std::isfinite(options.early_prefetch_lead) || options.early_prefetch_lead < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("early_prefetch_lead must be a number >= 0 (got ", options.early_prefetch_lead, ")"));
  }
  if (!(options.min_migration_share >= 0 && options.min_migration_share < 1)) {
    throw Error(ErrorKind::kInvalidArgument, cat("min_migration_share must be a number in [0, 1) (got ",
                                                 options.min_migration_share, ")"));
  }
}

PlanResult make_plan(const trace::Trace& trace, const Hardware& hardware, const PlannerOptions& options) {
  const auto begin = std::chrono::steady_clock::now();
  check_inputs(trace, hardware);
  check_options(options);
  const Prepared prep = prepare(trace);
  std::vector<std::int64_t> demand_after;
  PlanResult result = plan_once(prep, hardware, options, &demand_after);
  if (!result.plan.feasible) {
    diagnose(prep, hardware, options, result);
    // The simulator replays one step: a multi-step trace's plan names operators past it.
    if (options.stall_rounds > 0 && trace.step_begins.size() == 1 && any_tier_usable(hardware)) {
      result = detail::plan_with_stalls(prep, hardware, options, std::move(result), std::move(demand_after));
      result.diagnosis.message +=
          result.stats.planned_wait_s > 0
              ? cat("; planned with ", format_duration(result.stats.planned_wait_s), " of waits instead (",
                    result.stats.stall_rounds, " rounds): simulated step ",
                    format_duration(result.stats.simulated_step_s),
                    " (stall-free plan with reactive eviction: ",
                    format_duration(result.stats.stall_free_step_s), ")")
              : cat("; no plan with planned waits beat the stall-free one with reactive eviction (",
                    result.stats.stall_rounds, " rounds)");
    }
  } else {
    result.diagnosis.message =
        cat("feasible: peak ", format_bytes(result.plan.peak_before), " -> ",
            format_bytes(result.plan.peak_after), " within budget ", format_bytes(hardware.gpu_budget));
  }
  result.stats.planning_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return result;
}

}  // namespace teraio::plan
