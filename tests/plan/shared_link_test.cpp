// The step bound under the PCIe link's shared rate (plan/shared_link): returns one operator
// forces and departures another forces, in the same stretch, share the rate both directions
// get together.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "planner_test_util.hpp"
#include "sim_test_util.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

using simtest::add;
using simtest::kGB;
using simtest::unit_hardware;
using simtest::unit_trace;

// Ten 1 s operators; the budget is 1.5 GB. A (1.5 GB, used at ops 0 and 6) must be off at op
// 3, where B (1.5 GB, used at ops 3 and 9) runs, and B must be off at op 6. A can leave in
// [1, 3) and must be back in (4, 6]; B can leave only after op 3 and must be off by op 6. At 1
// GB/s each way every move has 0.5 s to spare on its own, so without the shared rate nothing
// stalls; but A's return and B's departure both fall in [4, 6].
trace::Trace crossing() {
  trace::Trace t = unit_trace(10);
  add(t, 3 * kGB / 2, {0, 6});  // A
  add(t, 3 * kGB / 2, {3, 9});  // B
  return t;
}

TEST(SharedLink, AReturnAndADepartureInTheSameStretchShareTheRate) {
  const trace::Trace t = crossing();
  Hardware hw = unit_hardware(3 * kGB / 2);
  EXPECT_DOUBLE_EQ(step_time_bound(t, hw).bound_s, 10.0);
  // 3 GB in the 2 s of [4, 6] at 1.2 GB/s together: 2.5 s, so 0.5 s of stall.
  hw.pcie_duplex_bandwidth = 1.2e9;
  const StepBound b = step_time_bound(t, hw);
  EXPECT_DOUBLE_EQ(b.bound_s, 10.5);
  EXPECT_EQ(b.binding_op, 3u);
  EXPECT_NE(b.reason.find("departures before operator 6"), std::string::npos) << b.reason;
  // At 1.5 GB/s together the 3 GB fit the 2 s; a cap of both rates added is no cap.
  hw.pcie_duplex_bandwidth = 1.5e9;
  EXPECT_DOUBLE_EQ(step_time_bound(t, hw).bound_s, 10.0);
  hw.pcie_duplex_bandwidth = 2e9;
  EXPECT_DOUBLE_EQ(step_time_bound(t, hw).bound_s, 10.0);
}

TEST(SharedLink, ABoundNoSimulatedPlanBeats) {
  const trace::Trace t = crossing();
  SimulationOptions enforce;
  enforce.enforce_budget = true;
  for (const double both : {1.0e9, 1.2e9, 1.5e9}) {
    Hardware hw = unit_hardware(3 * kGB / 2);
    hw.pcie_duplex_bandwidth = both;
    const double bound = step_time_bound(t, hw).bound_s;
    EXPECT_GE(simulate(t, Plan{}, hw, enforce).step_time_s + 1e-9, bound) << both;
    const PlanResult planned = make_plan(t, hw);
    EXPECT_GE(simulate(t, planned.plan, hw, enforce).step_time_s + 1e-9, bound) << both;
  }
}

TEST(SharedLink, NoSimulatedPlanBeatsItOnRandomTraces) {
  // The bound with the shared rate is never below the one without it, and never above what the
  // simulator makes of the planner's plan or of no plan at all, both under the same cap.
  SimulationOptions enforce;
  enforce.enforce_budget = true;
  std::size_t tighter = 0;
  for (std::uint32_t seed = 1; seed <= 30; ++seed) {
    const trace::Trace t = testing::random_trace(seed, 60, 30);
    const auto demand = trace::memory_demand(t);
    const std::uint64_t peak = *std::max_element(demand.begin(), demand.end());
    for (const double share : {0.8, 0.6}) {
      Hardware hw = testing::uniform_hardware(static_cast<std::uint64_t>(double(peak) * share), 2e9);
      hw.ssd_capacity = 0;
      const double alone = step_time_bound(t, hw).bound_s;
      hw.pcie_duplex_bandwidth = 2.4e9;
      const double bound = step_time_bound(t, hw).bound_s;
      const std::string where = cat("seed ", seed, " share ", share);
      EXPECT_GE(bound, alone) << where;
      if (bound > alone) ++tighter;
      if (!std::isfinite(bound)) continue;
      EXPECT_GE(simulate(t, Plan{}, hw, enforce).step_time_s + 1e-9, bound) << where;
      EXPECT_GE(simulate(t, make_plan(t, hw).plan, hw, enforce).step_time_s + 1e-9, bound) << where;
    }
  }
  EXPECT_GT(tighter, 0u);  // the shared rate bound somewhere
}

// The planner books the shared link too. Ten 1 s operators, a 2 GB budget, the host tier only
// at 1 GB/s each way, prefetches as late as bandwidth allows. A (1 GB, ops 0 and 9) must be away
// while X (1 GB, ops 2 and 7, kept across steps) and Y (1 GB, ops 3-6) are in; X must be away at
// op 9, where Z (1 GB) is made. Booked each way on its own, A leaves and X comes back in op 1, and
// X leaves and A comes back in op 8: 2 GB in 1 s twice, where a shared 1.2 GB/s carries 1.2 GB.
trace::Trace passing_twice() {
  trace::Trace t = unit_trace(10);
  add(t, kGB, {0, 9});        // A
  add(t, kGB, {2, 7}, true);  // X
  add(t, kGB, {3, 4, 5, 6});  // Y
  add(t, kGB, {9});           // Z
  return t;
}

TEST(SharedLink, ThePlannerBooksTheLinkBothDirectionsShare) {
  const trace::Trace t = passing_twice();
  Hardware hw = unit_hardware(2 * kGB);
  hw.ssd_capacity = 0;
  PlannerOptions latest;
  latest.early_prefetch = false;
  SimulationOptions enforce;
  enforce.enforce_budget = true;
  const auto issue_of = [](const Plan& plan, trace::TensorId tensor, Direction direction) {
    for (const Migration& m : plan.migrations)
      if (m.tensor == tensor && m.direction == direction) return m.issue_before;
    ADD_FAILURE() << "no migration of tensor " << tensor;
    return trace::OpIndex{0};
  };
  const PlanResult alone = make_plan(t, hw, latest);
  ASSERT_TRUE(alone.plan.feasible) << alone.diagnosis.message;
  EXPECT_EQ(issue_of(alone.plan, 1, Direction::kOffload), 1u);
  EXPECT_EQ(issue_of(alone.plan, 2, Direction::kPrefetch), 1u);
  EXPECT_DOUBLE_EQ(simulate(t, alone.plan, hw, enforce).step_time_s, 10.0);
  hw.pcie_duplex_bandwidth = 1.2e9;
  const double alone_shared = simulate(t, alone.plan, hw, enforce).step_time_s;
  EXPECT_GT(alone_shared, 10.0 + 1e-6);
  // Booking the link moves X's return to op 0, out of A's departure's way (A's return in op 8
  // was booked before X's departure, which has nowhere else to go: the greedy pass does not
  // undo a booking), and the step shared at 1.2 GB/s is shorter.
  const PlanResult shared = make_plan(t, hw, latest);
  ASSERT_TRUE(shared.plan.feasible) << shared.diagnosis.message;
  EXPECT_EQ(issue_of(shared.plan, 2, Direction::kPrefetch), 0u);
  EXPECT_LT(simulate(t, shared.plan, hw, enforce).step_time_s, alone_shared - 0.5);
  // A link that carries both rates added is no cap: the plan made each way alone.
  hw.pcie_duplex_bandwidth = 2e9;
  EXPECT_EQ(make_plan(t, hw, latest).plan.migrations, alone.plan.migrations);
}

}  // namespace
}  // namespace teraio::plan
