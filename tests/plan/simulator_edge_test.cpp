// Edge cases of the simulator: degenerate traces, and hardware where a tier or a channel is
// switched off (bandwidth 0), which the planner accepts and plans around.
#include <gtest/gtest.h>

#include "sim_test_util.hpp"
#include "teraio/core/error.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"

namespace teraio::plan {
namespace {

using simtest::add;
using simtest::kGB;
using simtest::offload;
using simtest::prefetch;
using simtest::unit_hardware;
using simtest::unit_trace;

TEST(SimulatorEdges, EmptyTraceTakesNoTime) {
  const auto r = simulate(trace::Trace{}, Plan{}, unit_hardware());
  EXPECT_DOUBLE_EQ(r.step_time_s, 0.0);
  EXPECT_DOUBLE_EQ(r.share_of_ideal, 1.0);
  EXPECT_TRUE(r.ok());
}

TEST(SimulatorEdges, PeakOperatorIsTheFirstWithTheMostMemory) {
  trace::Trace t = unit_trace(4);
  add(t, kGB, {0}, true);
  add(t, kGB, {1, 2});
  const auto r = simulate(t, Plan{}, unit_hardware());
  EXPECT_EQ(r.peak_memory, 2 * kGB);
  EXPECT_EQ(r.peak_op, 1u);
}

TEST(SimulatorEdges, InvalidTraceIsACallerError) {
  trace::Trace t = unit_trace(2);
  add(t, kGB, {5});
  try {
    simulate(t, Plan{}, unit_hardware());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(SimulatorEdges, PlanForHardwareWithASwitchedOffChannelReplays) {
  // T idle over ops 1-8, U at ops 4-5; the SSD cannot be read, so T goes to the host.
  trace::Trace t = unit_trace(10);
  add(t, kGB, {0, 9});
  add(t, kGB, {4, 5});
  Hardware hw = unit_hardware(kGB);
  hw.ssd_read_bandwidth = 0;
  const PlanResult planned = make_plan(t, hw);
  ASSERT_TRUE(planned.plan.feasible) << planned.diagnosis.message;
  const auto r = simulate(t, planned.plan, hw);
  EXPECT_TRUE(r.ok()) << r.describe(t);
  EXPECT_DOUBLE_EQ(r.step_time_s, 10.0);
}

TEST(SimulatorEdges, MigrationOverAChannelWithoutBandwidthIsRejected) {
  trace::Trace t = unit_trace(4);
  const auto a = add(t, kGB, {0, 3});
  Plan p;
  p.migrations = {offload(a, kGB, 1, 2, Tier::kSsd), prefetch(a, kGB, 2, 3, Tier::kSsd)};
  Hardware hw = unit_hardware();
  hw.ssd_write_bandwidth = 0;
  try {
    simulate(t, p, hw);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("migration 0"), std::string::npos) << e.what();
  }
}

TEST(SimulatorEdges, EnforcedBudgetNeverEvictsOverAChannelWithoutBandwidth) {
  // The SSD has room but no read bandwidth and the host tier is off: nothing can be evicted,
  // so the overshoot is reported instead of waiting forever for a transfer.
  trace::Trace t = unit_trace(4);
  add(t, kGB, {0, 3});
  add(t, kGB, {1, 2});
  Hardware hw = unit_hardware(kGB);
  hw.host_capacity = 0;
  hw.ssd_read_bandwidth = 0;
  SimulationOptions enforce;
  enforce.enforce_budget = true;
  const auto r = simulate(t, Plan{}, hw, enforce);
  EXPECT_EQ(r.evictions, 0u);
  EXPECT_GT(r.violation_counts[static_cast<std::size_t>(ViolationKind::kOverBudget)], 0u);
  EXPECT_DOUBLE_EQ(r.step_time_s, 4.0);
}

}  // namespace
}  // namespace teraio::plan
