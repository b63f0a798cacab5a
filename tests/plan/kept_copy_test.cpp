// Copies kept across read-only uses (trace::Tensor::read_only_uses, Migration::kept_copy):
// the planner drops a weight's device memory in its second trip out instead of copying it, the
// simulator replays the drop without traffic and copies again after an unexpected write, and
// the bound lets an unchanged tensor leave for free.
#include <gtest/gtest.h>

#include "sim_test_util.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"

namespace teraio::plan {
namespace {

using simtest::add;
using simtest::kGB;
using simtest::unit_hardware;
using simtest::unit_trace;

// 16 ops of 1 s. W (1 GB, persistent) is read at 1, 5, 9, 13 (two micro-batches, forward and
// backward) and written at 15 (the optimizer); a 1 GB temporary at 3 and another at 11 leave no
// room for it there under a 1 GB budget: W must be away around both.
trace::Trace two_micro_batches(bool read_only) {
  trace::Trace t = unit_trace(16);
  add(t, kGB, {1, 5, 9, 13, 15}, true);
  if (read_only) t.tensors[0].read_only_uses = {1, 5, 9, 13};
  add(t, kGB, {3});
  add(t, kGB, {11});
  return t;
}

Hardware fast() {
  Hardware hw = unit_hardware(kGB);
  hw.d2h_bandwidth = hw.h2d_bandwidth = 10e9;
  return hw;
}

std::vector<Migration> of_w(const Plan& plan) {
  std::vector<Migration> out;
  for (const Migration& m : plan.migrations)
    if (m.tensor == 1) out.push_back(m);
  return out;
}

TEST(KeptCopy, TheSecondTripOfAnUnchangedWeightDropsInsteadOfCopying) {
  const PlanResult r = make_plan(two_micro_batches(true), fast());
  ASSERT_TRUE(r.plan.feasible);
  const std::vector<Migration> w = of_w(r.plan);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0].direction, Direction::kOffload);
  EXPECT_FALSE(w[0].kept_copy);  // written by the optimizer since: copied out
  EXPECT_EQ(w[1].direction, Direction::kPrefetch);
  EXPECT_TRUE(w[1].kept_copy);  // its copy stays for the next trip
  EXPECT_EQ(w[2].direction, Direction::kOffload);
  EXPECT_TRUE(w[2].kept_copy);
  EXPECT_FALSE(w[2].urgent);
  EXPECT_FALSE(w[3].kept_copy);  // the optimizer writes it before its next trip
  EXPECT_EQ(r.stats.clean_offloads, 1u);
  EXPECT_EQ(r.stats.bytes_dropped, kGB);
  EXPECT_EQ(r.stats.bytes_to_ssd + r.stats.bytes_to_host, kGB);

  const SimulationResult s = simulate(two_micro_batches(true), r.plan, fast());
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.dropped_bytes, kGB);
  EXPECT_DOUBLE_EQ(s.step_time_s, 16.0);
  EXPECT_EQ(s.tier_bytes[0][0] + s.tier_bytes[1][0], kGB);  // one copy out per step
}

TEST(KeptCopy, WithoutReadOnlyUsesEveryTripCopies) {
  const PlanResult r = make_plan(two_micro_batches(false), fast());
  ASSERT_TRUE(r.plan.feasible);
  for (const Migration& m : r.plan.migrations) EXPECT_FALSE(m.kept_copy);
  EXPECT_EQ(r.stats.clean_offloads, 0u);
  EXPECT_EQ(simulate(two_micro_batches(false), r.plan, fast()).dropped, 0u);
}

TEST(KeptCopy, AWriteThePlanDidNotExpectMakesTheSimulatorCopyAgain) {
  const PlanResult r = make_plan(two_micro_batches(true), fast());
  trace::Trace written = two_micro_batches(true);
  written.tensors[0].read_only_uses = {1, 5, 13};  // op 9 now writes W
  const SimulationResult s = simulate(written, r.plan, fast());
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.dropped, 0u);
  EXPECT_EQ(s.tier_bytes[0][0] + s.tier_bytes[1][0], 2 * kGB);
}

TEST(KeptCopy, TheBoundLetsAnUnchangedTensorLeaveForFree) {
  // W (2 GB) is read at 0 and 3; X (2 GB) needs the whole 2 GB budget at op 1. W must leave
  // between op 0's end and op 1's start (no time: a 2 s stall at 1 GB/s) and come back within
  // op 2 (1 s of 2 s). A copy kept from before makes the way out free: only the 1 s remains.
  trace::Trace t = unit_trace(4);
  add(t, 2 * kGB, {0, 3}, true);
  add(t, 2 * kGB, {1});
  const Hardware hw = unit_hardware(2 * kGB);
  EXPECT_DOUBLE_EQ(step_time_bound(t, hw).bound_s, 6.0);
  t.tensors[0].read_only_uses = {0, 3};
  EXPECT_DOUBLE_EQ(step_time_bound(t, hw).bound_s, 5.0);
}

}  // namespace
}  // namespace teraio::plan
