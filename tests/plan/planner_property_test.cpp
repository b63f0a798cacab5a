// Property tests on random traces, checked by an independent recomputation of memory,
// host occupancy and channel schedules (planner_test_util.hpp).
#include <gtest/gtest.h>

#include "planner_test_util.hpp"
#include "teraio/plan/plan_io.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"

namespace teraio::plan {
namespace {

using testing::check_plan;
using testing::random_trace;

struct Scenario {
  std::uint32_t seed;
  double budget_share;  // budget as a share of the unplanned peak
  bool gpudirect;
  std::uint64_t host_cap;
  bool early_prefetch;
};

class PlannerProperties : public ::testing::TestWithParam<int> {};

TEST_P(PlannerProperties, PlansKeepEveryInvariant) {
  const int i = GetParam();
  const Scenario sc{static_cast<std::uint32_t>(100 + i), 0.5 + 0.05 * (i % 8), i % 2 == 0,
                    (i % 3 == 0) ? (256ull << 20) : (8ull << 30), i % 4 != 1};
  const trace::Trace t = random_trace(sc.seed, 150 + 10 * static_cast<std::size_t>(i), 120);
  const std::vector<std::uint64_t> demand = trace::memory_demand(t);
  const std::uint64_t peak = *std::max_element(demand.begin(), demand.end());
  Hardware hw;
  hw.gpu_budget = static_cast<std::uint64_t>(static_cast<double>(peak) * sc.budget_share);
  hw.host_capacity = sc.host_cap;
  hw.ssd_capacity = (i % 5 == 0) ? (512ull << 20) : (64ull << 30);
  hw.d2h_bandwidth = hw.h2d_bandwidth = 40e9;
  hw.ssd_write_bandwidth = 6e9;
  hw.ssd_read_bandwidth = 8e9;
  hw.gpudirect = sc.gpudirect;
  hw.request_latency_s = 20e-6;
  PlannerOptions options;
  options.early_prefetch = sc.early_prefetch;
  options.credit_over_budget_only = i % 3 == 1;
  options.stall_rounds = 0;  // the stall-free greedy: every deadline is met (stall search: below)

  const PlanResult r = make_plan(t, hw, options);
  const testing::CheckResult check = check_plan(t, r.plan);
  for (const std::string& v : check.violations) ADD_FAILURE() << v;
  EXPECT_EQ(check.peak, r.plan.peak_after);  // the planner's memory curve is the real one
  EXPECT_LE(check.host_peak, hw.host_capacity);
  EXPECT_EQ(check.host_peak, r.stats.host_peak);
  EXPECT_LE(r.stats.ssd_used, hw.ssd_capacity);
  EXPECT_EQ(r.plan.feasible, r.plan.peak_after <= hw.gpu_budget);
  if (r.plan.feasible) {
    EXPECT_LE(check.peak, hw.gpu_budget);
  }
  if (!r.plan.feasible) {
    EXPECT_FALSE(r.diagnosis.stuck_ops.empty());
    EXPECT_GT(r.diagnosis.min_feasible_budget, hw.gpu_budget);
    EXPECT_FALSE(r.diagnosis.message.empty());
  }
  EXPECT_NO_THROW(validate(r.plan, t));
  for (std::size_t k = 1; k < r.plan.migrations.size(); ++k)
    ASSERT_LE(r.plan.migrations[k - 1].issue_before, r.plan.migrations[k].issue_before);

  // Deterministic: a second run gives the same plan, byte for byte.
  EXPECT_EQ(plan_to_json(make_plan(t, hw, options).plan), plan_to_json(r.plan));
}

INSTANTIATE_TEST_SUITE_P(RandomTraces, PlannerProperties, ::testing::Range(0, 24));

// With the stall search the plan may miss the stall-free deadlines on purpose, but its memory,
// tiers and determinism hold, and it never simulates slower than the stall-free plan.
TEST_P(PlannerProperties, StallPlansKeepMemoryAndNeverSimulateSlower) {
  const int i = GetParam();
  const trace::Trace t =
      random_trace(static_cast<std::uint32_t>(300 + i), 150 + 10 * static_cast<std::size_t>(i), 120);
  const std::vector<std::uint64_t> demand = trace::memory_demand(t);
  const std::uint64_t peak = *std::max_element(demand.begin(), demand.end());
  Hardware hw;
  hw.gpu_budget = peak * static_cast<std::uint64_t>(4 + i % 4) / 10;
  hw.host_capacity = (i % 3 == 0) ? (256ull << 20) : (8ull << 30);
  hw.ssd_capacity = 64ull << 30;
  hw.d2h_bandwidth = hw.h2d_bandwidth = 4e9 * (1 + i % 3);  // little: stalls are needed
  hw.ssd_write_bandwidth = 1e9;
  hw.ssd_read_bandwidth = 2e9;
  hw.gpudirect = i % 2 == 0;
  const PlanResult r = make_plan(t, hw);
  const testing::CheckResult check = check_plan(t, r.plan);
  for (const std::string& v : check.violations)
    if (v.find("misses a deadline") == std::string::npos) ADD_FAILURE() << v;
  EXPECT_EQ(check.peak, r.plan.peak_after);
  EXPECT_EQ(r.plan.feasible, r.plan.peak_after <= hw.gpu_budget);
  EXPECT_LE(check.host_peak, hw.host_capacity);
  EXPECT_LE(r.stats.ssd_used, hw.ssd_capacity);
  EXPECT_NO_THROW(validate(r.plan, t));
  if (!r.diagnosis.feasible) {
    EXPECT_GT(r.stats.stall_rounds, 0);
    EXPECT_LE(r.stats.simulated_step_s, r.stats.stall_free_step_s);
    SimulationOptions replay;
    replay.enforce_budget = true;
    EXPECT_DOUBLE_EQ(simulate(t, r.plan, hw, replay).step_time_s, r.stats.simulated_step_s);
  }
  EXPECT_EQ(plan_to_json(make_plan(t, hw).plan), plan_to_json(r.plan));
}

TEST(PlannerProperties, DiagnosedMinimumBudgetIsFeasible) {
  const trace::Trace t = random_trace(7, 200, 150);
  const std::vector<std::uint64_t> demand = trace::memory_demand(t);
  Hardware hw;
  hw.gpu_budget = *std::max_element(demand.begin(), demand.end()) / 10;
  hw.host_capacity = 1ull << 30;
  hw.ssd_capacity = 1ull << 34;
  const PlanResult r = make_plan(t, hw);
  ASSERT_FALSE(r.plan.feasible);
  hw.gpu_budget = r.diagnosis.min_feasible_budget;
  EXPECT_TRUE(make_plan(t, hw).plan.feasible) << r.diagnosis.message;
}

TEST(PlannerProperties, EarlyPrefetchRaisesSlackWithoutBreakingTheBudget) {
  double with_total = 0, without_total = 0;
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    const trace::Trace t = random_trace(seed, 250, 150);
    const std::vector<std::uint64_t> demand = trace::memory_demand(t);
    Hardware hw;
    hw.gpu_budget = *std::max_element(demand.begin(), demand.end()) * 7 / 10;
    hw.host_capacity = 1ull << 32;
    hw.ssd_capacity = 1ull << 34;
    hw.d2h_bandwidth = hw.h2d_bandwidth = 32e9;
    hw.ssd_write_bandwidth = hw.ssd_read_bandwidth = 8e9;
    PlannerOptions off;
    off.early_prefetch = false;
    const PlanResult a = make_plan(t, hw, off);
    const PlanResult b = make_plan(t, hw);
    EXPECT_EQ(a.plan.feasible, b.plan.feasible);
    EXPECT_EQ(a.stats.offloads, b.stats.offloads);  // the pass only moves prefetches
    EXPECT_GE(b.stats.mean_prefetch_slack_s, a.stats.mean_prefetch_slack_s);
    if (b.plan.feasible) {
      EXPECT_LE(check_plan(t, b.plan).peak, hw.gpu_budget);
    }
    with_total += b.stats.mean_prefetch_slack_s;
    without_total += a.stats.mean_prefetch_slack_s;
  }
  EXPECT_GT(with_total, without_total);
}

}  // namespace
}  // namespace teraio::plan
