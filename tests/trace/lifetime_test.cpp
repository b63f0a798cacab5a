#include "teraio/trace/lifetime.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "teraio/core/error.hpp"
#include "trace_builders.hpp"

namespace teraio::trace {
namespace {

using testing::add_tensor;
using testing::make_trace;

TEST(OpStartTimes, CumulativeWithStepTimeAtEnd) {
  const Trace t = make_trace({1, 2, 0.5});
  EXPECT_EQ(op_start_times(t), (std::vector<double>{0, 1, 3, 3.5}));
  EXPECT_EQ(op_start_times(Trace{}), std::vector<double>{0});
}

TEST(InactivePeriods, GapsBetweenUsesOfAStepLocalTensor) {
  Trace t = make_trace({1, 2, 3, 4, 5, 6});
  add_tensor(t, 10, {0, 1, 4});  // gap 1->4 holds ops 2,3; 0->1 is adjacent, omitted
  const auto p = inactive_periods(t);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].tensor, 0u);
  EXPECT_EQ(p[0].last_use, 1u);
  EXPECT_EQ(p[0].next_use, 4u);
  EXPECT_FALSE(p[0].wraps);
  EXPECT_EQ(p[0].idle_ops, 2u);
  EXPECT_DOUBLE_EQ(p[0].idle_s, 3 + 4);
}

TEST(InactivePeriods, PersistentTensorWrapsAroundTheStep) {
  Trace t = make_trace({1, 2, 3, 4, 5, 6});
  add_tensor(t, 10, {1, 3}, /*persistent=*/true);
  const auto p = inactive_periods(t);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].last_use, 1u);
  EXPECT_EQ(p[0].next_use, 3u);
  EXPECT_EQ(p[0].idle_ops, 1u);
  EXPECT_DOUBLE_EQ(p[0].idle_s, 3);
  // After op 3: ops 4, 5 to the end of the step, then op 0 of the next step.
  EXPECT_TRUE(p[1].wraps);
  EXPECT_EQ(p[1].last_use, 3u);
  EXPECT_EQ(p[1].next_use, 1u);
  EXPECT_EQ(p[1].idle_ops, 3u);
  EXPECT_DOUBLE_EQ(p[1].idle_s, 5 + 6 + 1);
}

TEST(InactivePeriods, PersistentTensorUsedOnceIdlesAllOtherOps) {
  Trace t = make_trace({1, 2, 3, 4});
  add_tensor(t, 10, {2}, true);
  const auto p = inactive_periods(t);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].wraps);
  EXPECT_EQ(p[0].last_use, 2u);
  EXPECT_EQ(p[0].next_use, 2u);
  EXPECT_EQ(p[0].idle_ops, 3u);
  EXPECT_DOUBLE_EQ(p[0].idle_s, 1 + 2 + 4);
}

TEST(InactivePeriods, WrapWithNoOpInBetweenIsOmitted) {
  Trace t = make_trace({1, 2, 3});
  add_tensor(t, 10, {0, 2}, true);  // last op then first op: adjacent across the boundary
  const auto p = inactive_periods(t);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_FALSE(p[0].wraps);
  EXPECT_EQ(p[0].idle_ops, 1u);
}

TEST(InactivePeriods, SortedByTensorThenLastUse) {
  Trace t = make_trace({1, 1, 1, 1, 1, 1, 1, 1});
  add_tensor(t, 1, {0, 3, 6}, true);
  add_tensor(t, 1, {1, 5});
  const auto p = inactive_periods(t);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].tensor, 0u);
  EXPECT_EQ(p[1].tensor, 0u);
  EXPECT_EQ(p[2].tensor, 0u);
  EXPECT_TRUE(p[2].wraps);
  EXPECT_EQ(p[3].tensor, 1u);
  EXPECT_LT(p[0].last_use, p[1].last_use);
}

TEST(InactivePeriods, RejectsMismatchedStartTimes) {
  Trace t = make_trace({1, 2});
  EXPECT_THROW(inactive_periods(t, {0, 1}), Error);
}

TEST(MemoryDemand, UntrackedPersistentAndLiveStepLocalTensors) {
  Trace t = make_trace({1, 1, 1, 1, 1});
  t.untracked_bytes = 1000;
  add_tensor(t, 100, {2}, true);  // counted everywhere
  add_tensor(t, 10, {1, 3});      // live on ops 1..3 inclusive
  add_tensor(t, 1, {4});          // live on op 4 only
  EXPECT_EQ(memory_demand(t), (std::vector<std::uint64_t>{1100, 1110, 1110, 1110, 1101}));
  EXPECT_EQ(active_bytes(t), (std::vector<std::uint64_t>{0, 10, 100, 10, 1}));
}

// A tensor the program holds past its last use occupies memory until it is released, but is
// not active there: those operators are an inactive period that ends in its release.
TEST(MemoryDemand, HeldTensorsCountUntilReleased) {
  Trace t = make_trace({1, 1, 1, 1, 1});
  add_tensor(t, 10, {0, 1}).held_after_use = 2;  // released after op 3
  validate(t);
  EXPECT_EQ(release_op(t.tensors[0]), 3u);
  EXPECT_EQ(memory_demand(t), (std::vector<std::uint64_t>{10, 10, 10, 10, 0}));
  EXPECT_EQ(active_bytes(t), (std::vector<std::uint64_t>{10, 10, 0, 0, 0}));
  const auto periods = inactive_periods(t);
  ASSERT_EQ(periods.size(), 1u);
  EXPECT_TRUE(periods[0].released);
  EXPECT_FALSE(periods[0].wraps);
  EXPECT_EQ(periods[0].last_use, 1u);
  EXPECT_EQ(periods[0].next_use, 4u);  // the operator after its release
  EXPECT_EQ(periods[0].idle_ops, 2u);
  EXPECT_DOUBLE_EQ(periods[0].idle_s, 2.0);
  t.tensors[0].held_after_use = 4;
  EXPECT_THROW(validate(t), Error);
}

// The difference-array computations against a direct per-operator scan on random traces.
TEST(MemoryDemand, MatchesBruteForceOnRandomTraces) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    const int n = 1 + static_cast<int>(rng() % 40);
    Trace t;
    for (int k = 0; k < n; ++k)
      t.ops.push_back({"op", 0.001 * static_cast<double>(rng() % 10), Phase::kOther});
    t.untracked_bytes = rng() % 1000;
    const int m = static_cast<int>(rng() % 20);
    for (int i = 0; i < m; ++i) {
      std::vector<OpIndex> uses;
      for (int k = 0; k < n; ++k)
        if (rng() % 4 == 0) uses.push_back(static_cast<OpIndex>(k));
      if (uses.empty()) uses.push_back(static_cast<OpIndex>(rng() % static_cast<unsigned>(n)));
      Tensor& x = add_tensor(t, 1 + rng() % (1ull << 40), uses, rng() % 2 == 0);
      if (!x.persistent && rng() % 2 == 0)
        x.held_after_use = static_cast<std::uint32_t>(rng() % (static_cast<OpIndex>(n) - x.uses.back()));
    }
    validate(t);
    const auto demand = memory_demand(t);
    const auto active = active_bytes(t);
    const auto start = op_start_times(t);
    for (int k = 0; k < n; ++k) {
      std::uint64_t want = t.untracked_bytes, want_active = 0;
      for (const Tensor& x : t.tensors) {
        const auto op = static_cast<OpIndex>(k);
        if (x.persistent || (x.uses.front() <= op && op <= x.uses.back() + x.held_after_use)) want += x.bytes;
        if (std::find(x.uses.begin(), x.uses.end(), op) != x.uses.end()) want_active += x.bytes;
      }
      ASSERT_EQ(demand[static_cast<std::size_t>(k)], want);
      ASSERT_EQ(active[static_cast<std::size_t>(k)], want_active);
    }
    // Every operator a tensor is idle on lies in exactly one of its periods (persistent
    // tensors: all non-use ops; step-local: non-use ops from its first use to its release).
    std::vector<std::uint32_t> idle_count(t.tensors.size(), 0);
    for (const auto& p : inactive_periods(t)) {
      idle_count[p.tensor] += p.idle_ops;
      ASSERT_GT(p.idle_ops, 0u);
      ASSERT_GE(p.idle_s, 0);
    }
    for (std::size_t i = 0; i < t.tensors.size(); ++i) {
      const Tensor& x = t.tensors[i];
      const std::uint32_t span =
          x.persistent ? static_cast<std::uint32_t>(n) : release_op(x) - x.uses.front() + 1;
      ASSERT_EQ(idle_count[i], span - x.uses.size()) << "tensor " << i;
    }
  }
}

TEST(ScaleDurations, MultipliesEveryOperatorAndRefusesBadFactors) {
  Trace t = make_trace({1, 2, 0.5});
  add_tensor(t, 10, {0, 2});
  scale_durations(t, 0.5);
  EXPECT_EQ(op_start_times(t), (std::vector<double>{0, 0.5, 1.5, 1.75}));
  EXPECT_EQ(t.tensors[0].uses, (std::vector<OpIndex>{0, 2}));
  for (const double bad : {0.0, -1.0, 101.0, std::nan("")}) {
    EXPECT_THROW(scale_durations(t, bad), Error) << bad;
  }
  EXPECT_EQ(op_start_times(t).back(), 1.75);
}

TEST(FreeAtLastUse, ForgetsTheRecordedReleasesAndTheirMemory) {
  Trace t = make_trace({1, 1, 1, 1});
  add_tensor(t, 10, {0, 1}).held_after_use = 2;  // released after op 3
  add_tensor(t, 20, {1, 2});
  EXPECT_EQ(memory_demand(t), (std::vector<std::uint64_t>{10, 30, 30, 10}));
  EXPECT_EQ(free_at_last_use(t), 1u);
  EXPECT_EQ(t.tensors[0].held_after_use, 0u);
  EXPECT_EQ(memory_demand(t), (std::vector<std::uint64_t>{10, 30, 20, 0}));
  EXPECT_EQ(free_at_last_use(t), 0u);
}

TEST(JitterDurations, DrawsEachOperatorsFactorFromTheSpreadAndRepeatsForASeed) {
  Trace t = teraio::testing::trace_of_durations(std::vector<double>(200, 1.0));
  add_tensor(t, 10, {0, 199});
  Trace same = t;
  Trace other = t;
  jitter_durations(t, 0.1, 7);
  jitter_durations(same, 0.1, 7);
  jitter_durations(other, 0.1, 8);
  double low = 2;
  double high = 0;
  for (std::size_t k = 0; k < t.ops.size(); ++k) {
    EXPECT_EQ(t.ops[k].duration_s, same.ops[k].duration_s) << k;
    low = std::min(low, t.ops[k].duration_s);
    high = std::max(high, t.ops[k].duration_s);
  }
  EXPECT_GE(low, 0.9);
  EXPECT_LE(high, 1.1);
  EXPECT_LT(low, 0.92);  // 200 draws reach near both ends
  EXPECT_GT(high, 1.08);
  EXPECT_NE(op_start_times(t).back(), op_start_times(other).back());
  EXPECT_EQ(t.tensors[0].uses, (std::vector<OpIndex>{0, 199}));
  Trace still = same;
  jitter_durations(still, 0, 3);
  EXPECT_EQ(op_start_times(still), op_start_times(same));
  for (const double bad : {-0.1, 1.0, 2.0, std::nan("")}) {
    EXPECT_THROW(jitter_durations(t, bad, 1), Error) << bad;
  }
}

TEST(ExtractStep, ReindexesOpsAndDropsUnusedTensors) {
  Trace t = make_trace({1, 2, 3, 4, 5});
  t.step_begins = {0, 2};
  t.untracked_bytes = 7;
  add_tensor(t, 10, {0, 3}, true);
  add_tensor(t, 20, {1});
  add_tensor(t, 30, {2, 4});
  validate(t);
  const Trace s = extract_step(t, 1);
  EXPECT_EQ(s.ops.size(), 3u);
  EXPECT_EQ(s.ops[0].duration_s, 3);
  EXPECT_EQ(s.step_begins, std::vector<OpIndex>{0});
  EXPECT_EQ(s.untracked_bytes, 7u);
  ASSERT_EQ(s.tensors.size(), 2u);
  EXPECT_EQ(s.tensors[0].uses, std::vector<OpIndex>{1});
  EXPECT_TRUE(s.tensors[0].persistent);
  EXPECT_EQ(s.tensors[1].uses, (std::vector<OpIndex>{0, 2}));
  EXPECT_EQ(s.tensors[1].bytes, 30u);
  validate(s);
  // Held past its last use: kept within the step of that use, cut at the step's end, and not
  // carried to a step that uses it again.
  t.tensors[1].held_after_use = 3;  // last use 1, released after op 4, in the next step
  EXPECT_EQ(extract_step(t, 0).tensors[1].held_after_use, 0u);
  t.tensors[1].uses = {0};
  t.tensors[1].held_after_use = 1;
  EXPECT_EQ(extract_step(t, 0).tensors[1].held_after_use, 1u);
  t.tensors[2].uses = {1, 2};
  t.tensors[2].held_after_use = 1;  // released after op 3
  validate(t);
  EXPECT_EQ(extract_step(t, 0).tensors[2].held_after_use, 0u);
  EXPECT_EQ(extract_step(t, 1).tensors[1].held_after_use, 1u);  // step 1 holds only tensors 0 and 2
  t.tensors[1].uses = {1};
  t.tensors[1].held_after_use = 0;
  t.tensors[2].uses = {2, 4};
  t.tensors[2].held_after_use = 0;
  const Trace s0 = extract_step(t, 0);
  EXPECT_EQ(s0.ops.size(), 2u);
  EXPECT_EQ(s0.tensors.size(), 2u);
  try {
    extract_step(t, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

}  // namespace
}  // namespace teraio::trace
