// Hand-made traces where the right plan can be worked out on paper.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "planner_test_util.hpp"
#include "teraio/core/error.hpp"
#include "teraio/plan/plan_io.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"

namespace teraio::plan {
namespace {

using testing::add_tensor;
using testing::check_plan;
using testing::idle_tensor_trace;
using testing::ops_trace;
using testing::uniform_hardware;

Migration find(const Plan& plan, Direction direction) {
  for (const Migration& m : plan.migrations)
    if (m.direction == direction) return m;
  ADD_FAILURE() << "no " << to_string(direction);
  return {};
}

TEST(Planner, OffloadsTheIdleTensorAsEarlyAndPrefetchesAsLateAsBandwidthAllows) {
  const trace::Trace t = idle_tensor_trace();
  PlannerOptions options;
  options.early_prefetch = false;
  const PlanResult r = make_plan(t, uniform_hardware(100, 100), options);
  ASSERT_TRUE(r.plan.feasible) << r.diagnosis.message;
  EXPECT_EQ(r.plan.peak_before, 160u);
  EXPECT_LE(r.plan.peak_after, 100u);
  ASSERT_EQ(r.plan.migrations.size(), 2u);
  const Migration off = find(r.plan, Direction::kOffload);
  const Migration pre = find(r.plan, Direction::kPrefetch);
  EXPECT_EQ(off.tensor, t.tensors[0].id);
  EXPECT_EQ(off.tier, Tier::kSsd);  // SSD preferred
  EXPECT_EQ(off.issue_before, 1u);  // right after the use at op 0
  EXPECT_EQ(off.deadline, 2u);      // 100 B at 100 B/s: done during op 1
  EXPECT_TRUE(off.urgent);
  EXPECT_EQ(pre.issue_before, 8u);  // the latest start that finishes before op 9
  EXPECT_EQ(pre.deadline, 9u);
  EXPECT_TRUE(check_plan(t, r.plan).violations.empty());
}

// T is last used at op 0 but the program holds it until after op 7 (a variable not yet
// reassigned); U needs the room at ops 4-5. T can leave and need not come back: one offload.
TEST(Planner, ATensorHeldPastItsLastUseLeavesWithoutComingBack) {
  trace::Trace t = ops_trace(10);
  add_tensor(t, 100, {0}).held_after_use = 7;
  add_tensor(t, 60, {4, 5});
  const PlanResult r = make_plan(t, uniform_hardware(100, 100));
  ASSERT_TRUE(r.plan.feasible) << r.diagnosis.message;
  EXPECT_EQ(r.plan.peak_before, 160u);
  ASSERT_EQ(r.plan.migrations.size(), 1u);
  const Migration off = r.plan.migrations[0];
  EXPECT_EQ(off.direction, Direction::kOffload);
  EXPECT_EQ(off.tensor, t.tensors[0].id);
  EXPECT_EQ(off.issue_before, 1u);
  EXPECT_NO_THROW(validate(r.plan, t));
  const SimulationResult sim = simulate(t, r.plan, uniform_hardware(100, 100));
  EXPECT_TRUE(sim.ok()) << sim.describe(t);
  EXPECT_LE(sim.peak_memory, 100u);
  EXPECT_EQ(sim.memory_at_op[8], 0u);  // released after op 7 while away
  // The same offload alone is a plan error for a tensor that is used again.
  trace::Trace used_again = t;
  used_again.tensors[0].uses = {0, 9};
  used_again.tensors[0].held_after_use = 0;
  EXPECT_THROW(validate(r.plan, used_again), Error);
}

TEST(Planner, EarlyPrefetchMovesThePrefetchEarlierWithinBudget) {
  const trace::Trace t = idle_tensor_trace();
  PlannerOptions one_transfer;
  one_transfer.early_prefetch_lead = 1.0;
  const PlanResult r = make_plan(t, uniform_hardware(100, 100), one_transfer);
  ASSERT_TRUE(r.plan.feasible);
  const Migration pre = find(r.plan, Direction::kPrefetch);
  EXPECT_EQ(pre.issue_before, 7u);  // one transfer time (1 s) earlier; memory at op 7 stays at 100
  EXPECT_FALSE(pre.urgent);
  // Three transfer times would reach op 5, but U is there: T cannot be back before op 6.
  EXPECT_EQ(find(make_plan(t, uniform_hardware(100, 100)).plan, Direction::kPrefetch).issue_before, 6u);
  EXPECT_GT(r.stats.min_prefetch_slack_s, 0.99);
  const testing::CheckResult check = check_plan(t, r.plan);
  EXPECT_TRUE(check.violations.empty());
  EXPECT_LE(check.peak, 100u);
  // A lead that is not a number of transfer times is the caller's error.
  for (const double lead : {-1.0, std::nan("")}) {
    PlannerOptions bad;
    bad.early_prefetch_lead = lead;
    try {
      make_plan(t, uniform_hardware(100, 100), bad);
      ADD_FAILURE() << "lead " << lead << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    }
  }
}

TEST(Planner, FallsBackToHostWhenTheSsdIsTooSlow) {
  const trace::Trace t = idle_tensor_trace();
  Hardware hw = uniform_hardware(100, 100);
  hw.ssd_write_bandwidth = 10;  // 10 s to write 100 B: no room in the window
  const PlanResult r = make_plan(t, hw);
  ASSERT_TRUE(r.plan.feasible);
  EXPECT_EQ(find(r.plan, Direction::kOffload).tier, Tier::kHost);
  EXPECT_EQ(r.stats.bytes_to_host, 100u);
  EXPECT_EQ(r.stats.host_peak, 100u);
}

TEST(Planner, BounceThroughHostSharesThePcieChannel) {
  const trace::Trace t = idle_tensor_trace();
  Hardware hw = uniform_hardware(100, 100);
  hw.gpudirect = false;
  hw.d2h_bandwidth = 50;  // the SSD route is limited by PCIe: two operators to offload
  const PlanResult r = make_plan(t, hw);
  ASSERT_TRUE(r.plan.feasible);
  const Migration off = find(r.plan, Direction::kOffload);
  EXPECT_EQ(off.tier, Tier::kSsd);
  EXPECT_EQ(off.deadline, 3u);
  EXPECT_TRUE(check_plan(t, r.plan).violations.empty());
}

TEST(Planner, TooLittleBandwidthIsInfeasibleWithADiagnosis) {
  const trace::Trace t = idle_tensor_trace();
  PlannerOptions stall_free;
  stall_free.stall_rounds = 0;
  const PlanResult r = make_plan(t, uniform_hardware(100, 10), stall_free);  // 10 s per transfer, 8 idle ops
  EXPECT_FALSE(r.plan.feasible);
  EXPECT_FALSE(r.diagnosis.feasible);
  EXPECT_TRUE(r.plan.migrations.empty());
  EXPECT_EQ(r.diagnosis.stuck_ops, (std::vector<trace::OpIndex>{4, 5}));
  EXPECT_EQ(r.diagnosis.min_feasible_budget, 160u);  // nothing can move at this bandwidth
  EXPECT_NE(r.diagnosis.message.find("bandwidth"), std::string::npos) << r.diagnosis.message;
}

TEST(Planner, TooLittleBandwidthPlansWaitsThatFitTheBudget) {
  const trace::Trace t = idle_tensor_trace();
  const Hardware hw = uniform_hardware(100, 10);
  const PlanResult r = make_plan(t, hw);
  // No plan fits without stalls; the diagnosis still says so, and where the waits go.
  EXPECT_FALSE(r.diagnosis.feasible);
  EXPECT_EQ(r.diagnosis.min_feasible_budget, 160u);
  EXPECT_NE(r.diagnosis.message.find("waits"), std::string::npos) << r.diagnosis.message;
  EXPECT_GT(r.stats.stall_rounds, 0);
  // The waits let the 100-byte tensor leave around the 60-byte one's use: it fits now.
  EXPECT_TRUE(r.plan.feasible);
  EXPECT_LE(check_plan(t, r.plan).peak, 100u);
  EXPECT_GT(r.stats.planned_wait_s, 0);
  EXPECT_LT(r.stats.simulated_step_s, r.stats.stall_free_step_s);
  // The figure is the simulator's, replaying the plan with the budget held hard.
  SimulationOptions replay;
  replay.enforce_budget = true;
  const SimulationResult sim = simulate(t, r.plan, hw, replay);
  EXPECT_DOUBLE_EQ(sim.step_time_s, r.stats.simulated_step_s);
  EXPECT_EQ(sim.evictions, 0u);
  EXPECT_LE(sim.peak_memory, 100u);
}

TEST(Planner, BudgetBelowTheActiveTensorsNamesTheOperators) {
  const trace::Trace t = idle_tensor_trace();
  const PlanResult r = make_plan(t, uniform_hardware(50, 100));
  EXPECT_FALSE(r.plan.feasible);
  // Ops 0 and 9 use T (100 B); ops 4-5 hold U (60 B) even with T away.
  EXPECT_EQ(r.diagnosis.stuck_ops, (std::vector<trace::OpIndex>{0, 1, 4, 5, 8, 9}));
  EXPECT_EQ(r.diagnosis.min_feasible_budget, 100u);
  EXPECT_NE(r.diagnosis.message.find("operator 0 (op0)"), std::string::npos) << r.diagnosis.message;
}

TEST(Planner, RespectsTheHostCap) {
  // T1 (100 B) idle over ops 1-8, T2 (100 B) over ops 2-7; U (150 B) at ops 4-5. Budget 200
  // needs both away at ops 4-5 at once; the SSD tier is off, so the host must hold 200 B.
  trace::Trace t = ops_trace(10);
  add_tensor(t, 100, {0, 9});
  add_tensor(t, 100, {1, 8});
  add_tensor(t, 150, {4, 5});
  Hardware hw = uniform_hardware(200, 1000);
  hw.ssd_capacity = 0;
  hw.host_capacity = 150;
  const PlanResult small = make_plan(t, hw);
  EXPECT_FALSE(small.plan.feasible);
  EXPECT_LE(small.stats.host_peak, 150u);
  EXPECT_LE(check_plan(t, small.plan).host_peak, 150u);
  hw.host_capacity = 200;
  const PlanResult enough = make_plan(t, hw);
  EXPECT_TRUE(enough.plan.feasible) << enough.diagnosis.message;
  EXPECT_EQ(enough.stats.host_peak, 200u);
  EXPECT_TRUE(check_plan(t, enough.plan).violations.empty());
}

TEST(Planner, PersistentTensorWrapsAcrossTheStepBoundary) {
  // Optimizer state O (100 B, persistent) used at op 8 only; activation A (100 B) at ops 2-3.
  // O leaves after op 8, its offload runs through op 9 into op 0 of the next step, and it
  // is back before op 8.
  trace::Trace t = ops_trace(10);
  add_tensor(t, 100, {8}, /*persistent=*/true);
  add_tensor(t, 100, {2, 3});
  PlannerOptions options;
  options.early_prefetch = false;
  const PlanResult r = make_plan(t, uniform_hardware(150, 50), options);
  ASSERT_TRUE(r.plan.feasible) << r.diagnosis.message;
  const Migration off = find(r.plan, Direction::kOffload);
  const Migration pre = find(r.plan, Direction::kPrefetch);
  EXPECT_EQ(off.issue_before, 9u);
  EXPECT_EQ(off.deadline, 1u);  // wraps: deadline < issue_before
  EXPECT_EQ(pre.issue_before, 6u);
  EXPECT_EQ(pre.deadline, 8u);
  const testing::CheckResult check = check_plan(t, r.plan);
  EXPECT_TRUE(check.violations.empty());
  EXPECT_LE(check.peak, 150u);
}

TEST(Planner, OverBudgetCreditPicksTheTensorThatIsJustBigEnough) {
  // Big B (1000 B) and small S (60 B) are idle over the same window; ops 4-5 are 50 B over.
  // The paper's score (size × over-budget time) ties them and the tie goes to B (lower id);
  // crediting only the over-budget part prefers S, which moves 16× fewer bytes.
  trace::Trace t = ops_trace(10);
  add_tensor(t, 1000, {0, 9});
  add_tensor(t, 60, {0, 9});
  add_tensor(t, 50, {4, 5});
  const Hardware hw = uniform_hardware(1060, 1e6);
  PlannerOptions paper;
  paper.credit_over_budget_only = false;
  PlannerOptions over;
  over.credit_over_budget_only = true;
  const PlanResult a = make_plan(t, hw, paper);
  const PlanResult b = make_plan(t, hw, over);
  ASSERT_TRUE(a.plan.feasible);
  ASSERT_TRUE(b.plan.feasible);
  EXPECT_EQ(a.stats.bytes_to_ssd, 1000u);
  EXPECT_EQ(b.stats.bytes_to_ssd, 60u);
}

TEST(Planner, NothingToDoWhenTheTraceFits) {
  const trace::Trace t = idle_tensor_trace();
  const PlanResult r = make_plan(t, uniform_hardware(1000, 100));
  EXPECT_TRUE(r.plan.feasible);
  EXPECT_TRUE(r.diagnosis.feasible);
  EXPECT_TRUE(r.plan.migrations.empty());
  EXPECT_EQ(r.plan.peak_after, 160u);
}

// T (100 B) and S (8 B) are idle around U's use (104 B) at ops 4-5; the budget of 110 B needs
// both away there. Any size may move: both leave and the plan fits. With S under
// min_migration_share of the budget (0.2 x 110 = 22 B), S stays where it is and the plan is over
// budget by 2 B, which the diagnosis counts as memory no plan can move.
TEST(Planner, TensorsUnderTheSmallestShareAreNeverPlannedToMove) {
  trace::Trace t = ops_trace(10);
  add_tensor(t, 100, {0, 9});
  add_tensor(t, 8, {0, 9});
  add_tensor(t, 104, {4, 5});
  const trace::TensorId small = t.tensors[1].id;
  const auto moves = [](const Plan& plan, trace::TensorId id) {
    std::size_t count = 0;
    for (const Migration& m : plan.migrations) count += m.tensor == id;
    return count;
  };
  PlannerOptions any_size;
  any_size.min_migration_share = 0;
  const PlanResult all = make_plan(t, uniform_hardware(110, 100), any_size);
  ASSERT_TRUE(all.plan.feasible) << all.diagnosis.message;
  EXPECT_EQ(moves(all.plan, small), 2u);
  PlannerOptions options;
  options.min_migration_share = 0.2;
  options.stall_rounds = 0;
  const PlanResult kept = make_plan(t, uniform_hardware(110, 100), options);
  EXPECT_EQ(moves(kept.plan, small), 0u);
  EXPECT_EQ(moves(kept.plan, t.tensors[0].id), 2u);
  EXPECT_FALSE(kept.plan.feasible);
  EXPECT_EQ(kept.plan.peak_after, 112u);
  EXPECT_LT(kept.stats.periods, all.stats.periods);
  EXPECT_EQ(kept.stats.smallest_moved, 22u);  // 0.2 x 110 B
  EXPECT_EQ(all.stats.smallest_moved, 0u);
  EXPECT_GE(kept.diagnosis.min_feasible_budget, 112u);
  // The diagnosis counts S as memory no plan can move (memory_floor): without that, T's and S's
  // sizes would seem movable and the message would blame the bandwidth.
  EXPECT_NE(kept.diagnosis.message.find("must hold on the GPU"), std::string::npos) << kept.diagnosis.message;
  EXPECT_NE(kept.diagnosis.message.find("min_migration_share"), std::string::npos) << kept.diagnosis.message;
  // With the stall search, S still stays.
  options.stall_rounds = PlannerOptions{}.stall_rounds;
  EXPECT_EQ(moves(make_plan(t, uniform_hardware(110, 100), options).plan, small), 0u);
  // The default share of this tiny budget is under a byte: every size moves, as before.
  EXPECT_EQ(moves(make_plan(t, uniform_hardware(110, 100)).plan, small), 2u);
  for (const double share : {-0.1, 1.0, std::nan("")}) {
    PlannerOptions bad;
    bad.min_migration_share = share;
    EXPECT_THROW(check_options(bad), Error) << share;
  }
}

TEST(Planner, RejectsInvalidInput) {
  trace::Trace t = idle_tensor_trace();
  EXPECT_THROW(make_plan(t, uniform_hardware(0, 100)), Error);
  Hardware hw = uniform_hardware(100, 100);
  hw.ssd_read_bandwidth = -1;
  EXPECT_THROW(make_plan(t, hw), Error);
  t.tensors[0].uses = {12};
  try {
    make_plan(t, uniform_hardware(100, 100));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

}  // namespace
}  // namespace teraio::plan
