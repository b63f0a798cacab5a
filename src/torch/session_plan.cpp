// torch/session_plan: the session's plan — made from a profile (and again from a planned
// step's operator times), predicted by the simulator, handed to the executor, replaced by
// plan_filter's migrations, and kept to be run again later (recompute.tune()).
#include <algorithm>

#include "session.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::torch_binding {

plan::PlannerOptions Session::planner_options() const {
  plan::PlannerOptions options;
  options.stall_rounds = config_.stall_rounds;
  options.early_prefetch_lead = config_.early_prefetch_lead;
  options.min_migration_share = config_.min_migration_share;
  return options;
}

void Session::make_plan() {
  if (config_.gpu_budget == 0) {
    go_passive();
    return;
  }
  trace::validate(*trace_);
  const plan::PlannerOptions options = planner_options();
  const std::vector<std::uint64_t> active = trace::active_bytes(*trace_);
  const auto worst = std::max_element(active.begin(), active.end());
  // Planned for a little less than the executor enforces (SessionConfig::plan_margin), never
  // for less than one operator needs at once; the prediction below simulates the plan under the
  // budget the executor enforces.
  plan::Hardware planning = hardware_;
  const std::uint64_t floor = worst == active.end() ? 0 : std::min(*worst, hardware_.gpu_budget);
  planning.gpu_budget = std::max(hardware_.gpu_budget - plan_margin(), floor);  // the margin is below it
  plan_ = plan::make_plan(*trace_, planning, options);
  if (worst != active.end() && *worst > hardware_.gpu_budget) {
    const auto k = static_cast<std::size_t>(worst - active.begin());
    throw Error(ErrorKind::kInfeasible,
                cat("gpu_budget ", format_bytes(hardware_.gpu_budget), hole_ ? " (after the hole)" : "",
                    " is below what operator ", k, " (", trace_->ops[k].name, ") needs at once: ",
                    format_bytes(*worst), "; no plan can reach it. Planner: ", plan_->diagnosis.message));
  }
  if (plan_->plan.peak_before <= hardware_.gpu_budget) {
    // The step fits the budget as profiled (the margin is for plans that move tensors).
    plan_->plan.migrations.clear();
    predict();  // the profiled step, reported beside the measured one
    go_passive();
    return;
  }
  if (!plan_->diagnosis.feasible && !retiming_) {
    // Said once, when planning from a profile: every later step runs this plan and its waits.
    const std::string planned_for =
        planning.gpu_budget < hardware_.gpu_budget
            ? cat(" (planned for ", format_bytes(planning.gpu_budget), ", the plan margin kept free)")
            : std::string();
    log::warn(cat("TeraIO: no plan fits the budget ", format_bytes(hardware_.gpu_budget), planned_for,
                  " without stalls",
                  plan_->plan.feasible ? "; the plan's planned waits keep it within the budget"
                                       : "; reactive eviction covers what the plan leaves over it",
                  " (", plan_->diagnosis.message, ")"));
  }
  set_migrations(plan_->plan.migrations);
  phase_ = SessionPhase::kPlanned;
}

void Session::retime() {
  // Timed after the operators' device waits and host-side fetches, like the profile: what is
  // left is the operators' own time in a step the host runs ahead of, as it does once planned.
  const std::vector<double> durations = timer_->durations(trace_->ops.size());
  if (!retiming_) {
    retiming_ =
        Retiming{0, prediction_ ? prediction_->profiled_step_s : 0, prediction_ ? prediction_->step_s : 0};
  }
  ++retiming_->steps;
  for (std::size_t k = 0; k < durations.size(); ++k) {
    if (durations[k] > 0) trace_->ops[k].duration_s = durations[k];  // 0: not timed (a failed operator)
  }
  make_plan();
}

void Session::predict() {
  PlanPrediction p;
  plan::SimulationOptions options;
  options.enforce_budget = true;  // as the runtime does: reactive eviction covers a shortfall
  const plan::SimulationResult simulated = plan::simulate(*trace_, plan_->plan, hardware_, options);
  p.profiled_step_s = simulated.ideal_step_time_s;
  p.step_s = simulated.step_time_s;
  p.stall_s = simulated.stall_s;
  const plan::StepBound bound = plan::step_time_bound(*trace_, hardware_);
  p.bound_step_s = bound.bound_s;
  p.bound_reason = bound.reason;
  prediction_ = p;
}

void Session::set_migrations(std::vector<plan::Migration> migrations) {
  std::lock_guard lock(mutex_);
  if (phase_ == SessionPhase::kClosed) throw Error(ErrorKind::kShutdown, "the TeraIO session is closed");
  if (!plan_ || !trace_) throw Error(ErrorKind::kInvalidArgument, "there is no plan yet");
  for (const auto& m : migrations) {
    if (m.issue_before >= trace_->ops.size() || m.deadline >= trace_->ops.size()) {
      throw Error(ErrorKind::kInvalidArgument,
                  cat("migration of tensor ", m.tensor, " names operator ",
                      std::max(m.issue_before, m.deadline), ", past the step's ", trace_->ops.size()));
    }
  }
  plan_->plan.migrations = std::move(migrations);
  hand_plan_to_executor();
  predict();
}

void Session::hand_plan_to_executor() {
  tracks_writes_ =
      config_.keep_copies || std::any_of(plan_->plan.migrations.begin(), plan_->plan.migrations.end(),
                                         [](const plan::Migration& m) { return m.kept_copy; });
  plan_op_names_.clear();
  for (const auto& op : trace_->ops) plan_op_names_.push_back(op.name);
  plan_bytes_.clear();
  for (const auto& tensor : trace_->tensors) plan_bytes_[tensor.id] = tensor.bytes;
  executor_->set_plan(plan_->plan);
  executor_->set_next_uses(runtime::NextUses(*trace_));
  position_due_ = true;
}

std::shared_ptr<KeptPlan> Session::keep_plan() {
  std::lock_guard lock(mutex_);
  check_between_steps("session.keep_plan()");
  if (phase_ != SessionPhase::kPlanned || !plan_ || !trace_) {
    throw Error(
        ErrorKind::kInvalidArgument,
        cat("session.keep_plan() keeps the plan of a planned session; this one is ", to_string(phase_)));
  }
  return std::make_shared<KeptPlan>(KeptPlan{serial_, *trace_, *plan_, prediction_, retiming_, retime_left_});
}

void Session::use_plan(const KeptPlan& kept) {
  std::lock_guard lock(mutex_);
  check_between_steps("session.use_plan()");
  if (kept.session != serial_) {
    throw Error(ErrorKind::kInvalidArgument,
                "session.use_plan() takes a plan this session kept: another session's names other tensors");
  }
  if (phase_ != SessionPhase::kPlanned) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("session.use_plan() replaces the plan of a planned session; this one is ",
                    to_string(phase_), " (session.reprofile() profiles the step again instead)"));
  }
  trace_ = kept.trace;
  plan_ = kept.plan;
  retiming_ = kept.retiming;
  retime_left_ = kept.retime_left;
  divergent_steps_ = 0;
  prediction_ = kept.prediction;  // simulating the plan again would give the same figures
  hand_plan_to_executor();
}

}  // namespace teraio::torch_binding
