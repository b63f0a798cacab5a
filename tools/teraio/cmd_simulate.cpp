#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "command.hpp"
#include "hardware_options.hpp"
#include "planner_options.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/plan_io.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/plan/timeline.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::cli {
namespace {

void write_summary(const std::string& path, const trace::Trace& t, const plan::Plan& p,
                   const plan::Hardware& hw, const plan::SimulationResult& r, const plan::StepBound& bound,
                   bool planned_here) {
  const nlohmann::json summary = {
      {"source", t.source},
      {"budget_bytes", hw.gpu_budget},
      {"plan_feasible", p.feasible},
      {"planned_here", planned_here},
      {"migrations", p.migrations.size()},
      {"step_s", r.step_time_s},
      {"ideal_s", r.ideal_step_time_s},
      {"share_of_ideal", r.share_of_ideal},
      {"stall_s", r.stall_s},
      {"peak_bytes", r.peak_memory},
      {"host_peak_bytes", r.host_peak},
      {"ssd_peak_bytes", r.ssd_peak},
      {"host_bytes_out", r.tier_bytes[0][0]},
      {"ssd_bytes_out", r.tier_bytes[1][0]},
      {"evictions", r.evictions},
      {"eviction_bytes", r.eviction_bytes},
      {"dropped", r.dropped},
      {"dropped_bytes", r.dropped_bytes},
      {"demand_fetches", r.demand_fetches},
      {"violations", r.violation_count()},
      {"pcie_d2h_util", r.channels[0].utilization},
      {"pcie_h2d_util", r.channels[1].utilization},
      {"ssd_write_util", r.channels[2].utilization},
      {"ssd_read_util", r.channels[3].utilization},
      {"bound_s", bound.bound_s},
      {"bound_share", bound.max_share},
  };
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw_errno(errno, "cannot open ", path);
  // The trace's source is free-form text; replace invalid UTF-8 rather than fail the run.
  const std::string text = summary.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written) throw_errno(errno, "cannot write ", path);
}

// The memory curve against the budget, operator by operator, for plotting.
void write_op_csv(const std::string& path, const trace::Trace& t, const plan::SimulationResult& r) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw_errno(errno, "cannot open ", path);
  const std::vector<std::uint64_t> demand = trace::memory_demand(t);
  std::fprintf(f, "op,name,phase,start_s,duration_s,stall_s,memory_bytes,demand_bytes,budget_bytes\n");
  double now = 0;
  for (std::size_t k = 0; k < r.stall_per_op.size(); ++k) {
    now += r.stall_per_op[k];
    std::string name = t.ops[k].name;  // quoted: profiled operator names may hold commas
    for (std::size_t i = name.find('"'); i != std::string::npos; i = name.find('"', i + 2))
      name.insert(i, 1, '"');
    std::fprintf(f, "%zu,\"%s\",%s,%.9f,%.9f,%.9f,%llu,%llu,%llu\n", k, name.c_str(),
                 std::string(trace::to_string(t.ops[k].phase)).c_str(), now, t.ops[k].duration_s,
                 r.stall_per_op[k], static_cast<unsigned long long>(r.memory_at_op[k]),
                 static_cast<unsigned long long>(demand[k]), static_cast<unsigned long long>(r.budget));
    now += t.ops[k].duration_s;
  }
  if (std::fclose(f) != 0) throw_errno(errno, "cannot write ", path);
}

int run_simulate(const std::vector<std::string>& args) {
  Options opts("simulate",
               "replay a trace with a plan on the hardware model: step time, stalls, memory, invariants");
  opts.add_positional("trace", "trace file (JSON or binary)");
  opts.add_positional("plan", "plan file; without one, the trace is planned here for the hardware options",
                      false);
  opts.add("save-plan", "with no plan file: write the plan made here to this file");
  opts.add("step", "simulate this step of a multi-step trace (as `teraio plan --step`)", "0");
  opts.add("steps", "consecutive steps to simulate; the last one is reported", "2");
  opts.add("timeline", "write the reported step as Chrome/Perfetto trace-event JSON to this file");
  opts.add("top", "operators with the longest stalls to list", "10");
  opts.add("summary", "write the headline figures as one JSON object to this file");
  opts.add("csv", "write one row per operator (start, stall, device memory, demand without migrations)");
  opts.add_flag("enforce-budget",
                "keep the budget hard: wait for offloads, evict and fetch on demand (reactive mode)");
  add_stall_options(opts);
  add_hardware_options(opts);
  add_operator_time_options(opts);
  if (!opts.parse(args)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  // Cut to one step here, before planning, so that a plan made here and the replay agree.
  const trace::Trace t = load_step(opts);
  plan::Plan p;
  plan::Hardware hw;
  bool planned_here = false;
  if (opts.positional("plan")) {
    p = plan::read_plan(*opts.positional("plan"));
    // A plan made for another trace (or another --step) would replay as nonsense.
    plan::validate(p, t);
    hw = hardware_from_options(opts, p.hardware);
  } else {
    hw = hardware_from_options(opts, plan::Hardware{});
    if (hw.gpu_budget == 0)
      throw Error(ErrorKind::kInvalidArgument, "without a plan file, --budget is needed");
    plan::PlannerOptions po;
    apply_stall_options(opts, po);
    const plan::PlanResult planned = plan::make_plan(t, hw, po);
    p = planned.plan;
    planned_here = true;
    std::printf("planned in %s: %zu migrations, %s\n", format_duration(planned.stats.planning_s).c_str(),
                p.migrations.size(), planned.diagnosis.message.c_str());
    if (opts.has("save-plan")) plan::write_plan(p, opts.str("save-plan"));
  }
  plan::SimulationOptions so;
  so.steps = static_cast<std::size_t>(std::max<std::int64_t>(1, opts.integer("steps")));
  so.top_stalls = static_cast<std::size_t>(std::max<std::int64_t>(0, opts.integer("top")));
  so.record_timeline = opts.has("timeline");
  so.enforce_budget = opts.flag("enforce-budget");
  const plan::SimulationResult r = plan::simulate(t, p, hw, so);
  const plan::StepBound bound = plan::step_time_bound(t, hw);
  std::printf("%s\n%zu operators, %zu tensors, %zu migrations\n%s", hw.describe().c_str(), t.ops.size(),
              t.tensors.size(), p.migrations.size(), r.describe(t).c_str());
  std::printf("bound            no plan beats %s (%.1f%% of ideal): %s\n",
              format_duration(bound.bound_s).c_str(), 100.0 * bound.max_share, bound.reason.c_str());
  if (opts.has("timeline")) {
    plan::write_timeline(t, p, r, opts.str("timeline"));
    std::printf("timeline written to %s (open in ui.perfetto.dev)\n", opts.str("timeline").c_str());
  }
  if (opts.has("csv")) write_op_csv(opts.str("csv"), t, r);
  if (opts.has("summary")) write_summary(opts.str("summary"), t, p, hw, r, bound, planned_here);
  return r.ok() ? 0 : 3;
}

const CommandRegistration kRegistration{
    "simulate", "replay a trace with a plan and check it (step time, stalls)", run_simulate};

}  // namespace
}  // namespace teraio::cli
