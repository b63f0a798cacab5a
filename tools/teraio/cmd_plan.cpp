#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "command.hpp"
#include "hardware_options.hpp"
#include "planner_options.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/plan_io.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::cli {
namespace {

// "3-7, 12, 40-41" for a sorted list of operators, at most `limit` runs.
std::string op_ranges(const std::vector<trace::OpIndex>& ops, std::size_t limit) {
  std::string out;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ops.size();) {
    std::size_t j = i;
    while (j + 1 < ops.size() && ops[j + 1] == ops[j] + 1) ++j;
    if (runs == limit) return out + ", ...";
    out += cat(runs ? ", " : "", ops[i], j > i ? cat("-", ops[j]) : std::string());
    ++runs;
    i = j + 1;
  }
  return out;
}

int run_plan(const std::vector<std::string>& raw_args) {
  Options opts("plan",
               "plan which tensors to offload, where and when, so that a trace fits a GPU memory budget");
  opts.add_positional("trace", "trace file (JSON or binary)");
  opts.add("output", "write the plan here (-o works too)");
  opts.add("host", "host tier capacity (same as --host-capacity)");
  opts.add("ssd", "SSD tier capacity (same as --ssd-capacity)");
  opts.add("step", "plan this step of a multi-step trace", "0");
  opts.add("probes", "planner runs the infeasibility diagnosis may spend", "6");
  opts.add_flag("no-early-prefetch", "skip the pass that moves prefetches earlier");
  opts.add("early-prefetch-lead", "how far earlier that pass may move a prefetch, in its own transfer times",
           cat(plan::PlannerOptions{}.early_prefetch_lead));
  opts.add(
      "min-migration-share",
      "never plan to move a tensor smaller than this share of the budget (0: any size; default 1/65536)");
  opts.add_flag("over-budget-credit", "credit a migration only with the over-budget bytes it removes");
  add_stall_options(opts);
  add_hardware_options(opts);
  add_operator_time_options(opts);
  std::vector<std::string> args;
  for (const std::string& a : raw_args) args.push_back(a == "-o" ? "--output" : a);
  if (!opts.parse(args)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  const trace::Trace t = load_step(opts);
  plan::Hardware hw = hardware_from_options(opts, plan::Hardware{});
  if (opts.has("host")) hw.host_capacity = opts.bytes("host");
  if (opts.has("ssd")) hw.ssd_capacity = opts.bytes("ssd");
  if (hw.gpu_budget == 0) throw Error(ErrorKind::kInvalidArgument, "--budget is required");

  plan::PlannerOptions po;
  po.early_prefetch = !opts.flag("no-early-prefetch");
  po.early_prefetch_lead = opts.number("early-prefetch-lead");
  if (!std::isfinite(po.early_prefetch_lead) || po.early_prefetch_lead < 0)
    throw Error(ErrorKind::kInvalidArgument, "--early-prefetch-lead must be a number >= 0");
  // Unless given, the library's own value: a printed default would round it.
  if (opts.has("min-migration-share")) po.min_migration_share = opts.number("min-migration-share");
  if (!(po.min_migration_share >= 0 && po.min_migration_share < 1))
    throw Error(ErrorKind::kInvalidArgument, "--min-migration-share must be a number in [0, 1)");
  po.credit_over_budget_only = opts.flag("over-budget-credit");
  po.diagnosis_probes = static_cast<int>(opts.integer("probes"));
  apply_stall_options(opts, po);
  const plan::PlanResult r = plan::make_plan(t, hw, po);
  const plan::PlanStats& s = r.stats;

  std::printf("%s\n", hw.describe().c_str());
  std::printf(
      "trace: %zu operators, %zu tensors, %zu inactive periods to choose from (tensors of %s and more)\n",
      t.ops.size(), t.tensors.size(), s.periods, format_bytes(s.smallest_moved).c_str());
  std::printf("peak memory: %s without migrations, %s with the plan (budget %s): %s\n",
              format_bytes(r.plan.peak_before).c_str(), format_bytes(r.plan.peak_after).c_str(),
              format_bytes(hw.gpu_budget).c_str(), r.plan.feasible ? "fits" : "DOES NOT FIT");
  std::printf("migrations: %zu (%zu offloads; %zu urgent); per step %s to SSD, %s to host\n",
              r.plan.migrations.size(), s.offloads, s.urgent, format_bytes(s.bytes_to_ssd).c_str(),
              format_bytes(s.bytes_to_host).c_str());
  std::printf("tiers: host peak %s, SSD space %s; prefetch slack min %s, mean %s\n",
              format_bytes(s.host_peak).c_str(), format_bytes(s.ssd_used).c_str(),
              format_duration(s.min_prefetch_slack_s).c_str(),
              format_duration(s.mean_prefetch_slack_s).c_str());
  std::printf("planned in %s (%zu candidate evaluations)\n", format_duration(s.planning_s).c_str(),
              s.evaluations);
  std::printf("%s\n", r.diagnosis.message.c_str());
  // The diagnosis is the stall-free planner's: with the stall search its operators may differ
  // from those the chosen plan leaves over budget.
  if (!r.diagnosis.feasible)
    std::printf("operators over budget without stalls: %s\n", op_ranges(r.diagnosis.stuck_ops, 12).c_str());
  if (opts.has("output")) {
    plan::write_plan(r.plan, opts.str("output"));
    std::printf("plan written to %s\n", opts.str("output").c_str());
  }
  // 2 is taken by usage errors (bad options); 3 says "no plan fits", as simulate's 3 says
  // "an invariant broke", so scripts can tell a result from a mistake.
  return r.plan.feasible ? 0 : 3;
}

const CommandRegistration kRegistration{"plan", "plan tensor migrations for a trace and a memory budget",
                                        run_plan};

}  // namespace
}  // namespace teraio::cli
