// Edge cases of the planner: degenerate traces, budgets on the boundary, switched-off tiers
// and channels, and tensors of 0 bytes.
#include <gtest/gtest.h>

#include "planner_test_util.hpp"
#include "teraio/core/error.hpp"
#include "teraio/plan/plan_io.hpp"
#include "teraio/plan/planner.hpp"

namespace teraio::plan {
namespace {

using testing::add_tensor;
using testing::check_plan;
using testing::idle_tensor_trace;
using testing::ops_trace;
using testing::uniform_hardware;

TEST(PlannerEdges, EmptyTraceIsTriviallyFeasible) {
  const PlanResult r = make_plan(trace::Trace{}, uniform_hardware(1, 100));
  EXPECT_TRUE(r.plan.feasible);
  EXPECT_TRUE(r.diagnosis.feasible);
  EXPECT_TRUE(r.plan.migrations.empty());
  EXPECT_EQ(r.plan.peak_before, 0u);
}

TEST(PlannerEdges, OneOperatorCannotMoveAnything) {
  trace::Trace t = ops_trace(1);
  add_tensor(t, 100, {0}, /*persistent=*/true);
  const PlanResult r = make_plan(t, uniform_hardware(50, 1e9));
  EXPECT_FALSE(r.plan.feasible);
  EXPECT_TRUE(r.plan.migrations.empty());
  EXPECT_EQ(r.diagnosis.stuck_ops, (std::vector<trace::OpIndex>{0}));
  EXPECT_EQ(r.diagnosis.min_feasible_budget, 100u);
}

TEST(PlannerEdges, BudgetExactlyAtThePeakNeedsNoMigration) {
  const trace::Trace t = idle_tensor_trace();
  const PlanResult at = make_plan(t, uniform_hardware(160, 100));
  EXPECT_TRUE(at.plan.feasible);
  EXPECT_TRUE(at.plan.migrations.empty());
  // One byte less and T has to leave.
  const PlanResult below = make_plan(t, uniform_hardware(159, 100));
  EXPECT_TRUE(below.plan.feasible) << below.diagnosis.message;
  EXPECT_EQ(below.plan.migrations.size(), 2u);
  EXPECT_TRUE(check_plan(t, below.plan).violations.empty());
}

TEST(PlannerEdges, BothTiersDisabledSaysSoInTheDiagnosis) {
  const trace::Trace t = idle_tensor_trace();
  Hardware hw = uniform_hardware(100, 100);
  hw.host_capacity = 0;
  hw.ssd_capacity = 0;
  const PlanResult r = make_plan(t, hw);
  EXPECT_FALSE(r.plan.feasible);
  EXPECT_TRUE(r.plan.migrations.empty());
  EXPECT_EQ(r.diagnosis.min_feasible_budget, 160u);
  EXPECT_EQ(r.diagnosis.stuck_ops, (std::vector<trace::OpIndex>{4, 5}));
  EXPECT_NE(r.diagnosis.message.find("no tier"), std::string::npos) << r.diagnosis.message;
}

TEST(PlannerEdges, ZeroBandwidthChannelIsPlannedAround) {
  const trace::Trace t = idle_tensor_trace();
  Hardware hw = uniform_hardware(100, 100);
  hw.ssd_read_bandwidth = 0;  // the SSD tier cannot give anything back: host only
  const PlanResult r = make_plan(t, hw);
  ASSERT_TRUE(r.plan.feasible) << r.diagnosis.message;
  for (const Migration& m : r.plan.migrations) EXPECT_EQ(m.tier, Tier::kHost);
  hw.d2h_bandwidth = 0;  // and now the host tier cannot take anything either
  const PlanResult none = make_plan(t, hw);
  EXPECT_FALSE(none.plan.feasible);
  EXPECT_NE(none.diagnosis.message.find("no tier"), std::string::npos) << none.diagnosis.message;
}

TEST(PlannerEdges, ZeroByteTensorsAreNeverMigratedAndThePlanReadsBack) {
  // A 0-byte tensor idle over the same window as T frees nothing; a migration of it would
  // also be rejected by the plan reader. Both scoring rules must skip it.
  trace::Trace t = ops_trace(10);
  add_tensor(t, 0, {0, 9});
  add_tensor(t, 100, {0, 9});
  add_tensor(t, 60, {4, 5});
  for (const bool over_budget_credit : {false, true}) {
    PlannerOptions options;
    options.credit_over_budget_only = over_budget_credit;
    const PlanResult r = make_plan(t, uniform_hardware(100, 100), options);
    ASSERT_TRUE(r.plan.feasible) << r.diagnosis.message;
    for (const Migration& m : r.plan.migrations) EXPECT_GT(m.bytes, 0u);
    EXPECT_EQ(plan_from_json(plan_to_json(r.plan)).migrations, r.plan.migrations);
  }
}

TEST(PlannerEdges, MemoryTotalsBeyondSignedRangeAreRejected) {
  // The trace formats accept any 64-bit sizes; the planner's memory curves are signed.
  trace::Trace t = idle_tensor_trace();
  t.tensors[0].bytes = 1ull << 63;
  try {
    make_plan(t, uniform_hardware(100, 100));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("tensor 1001"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_plan(idle_tensor_trace(), uniform_hardware(1ull << 63, 100)), Error);
}

}  // namespace
}  // namespace teraio::plan
