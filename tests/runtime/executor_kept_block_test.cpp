// Kept blocks (TensorMemory::kept_bytes, the torch session's reuse_blocks): the memory of a
// tensor moved out stays with the memory for a later fetch of its size. It counts against the
// budget, goes back before any tensor is moved out for room, and is never kept between steps or
// without a budget.
#include <gtest/gtest.h>

#include "runtime_test_support.hpp"

namespace teraio::runtime {
namespace {

using testing::offload;
using testing::plan_of;
using testing::prefetch;
using testing::Rig;

constexpr std::uint64_t kBytes = 16 * kKiB;

// A planned step over tensors 1 and 2 whose plan moves 1 out at operator 0 (and, with
// `back_at`, brings it back there, for its use one operator later); returns once 1 is away.
Executor& planned_with_one_away(Rig& rig, std::optional<OpIndex> back_at = std::nullopt) {
  rig.memory().keep_released_blocks();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  Executor& ex = rig.executor();
  std::vector<plan::Migration> migrations = {offload(1, kBytes, plan::Tier::kHost, 0)};
  if (back_at) migrations.push_back(prefetch(1, kBytes, plan::Tier::kHost, *back_at, *back_at + 1));
  ex.set_plan(plan_of(migrations));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(0, {});
  ex.after_op(0, {});
  ex.drain();
  EXPECT_EQ(ex.location(1), Location::kHost);
  return ex;
}

TEST(ExecutorKeptBlock, AFetchTakesTheBlockOfAnEvictionOfItsSize) {
  Rig rig(2 * kBytes);
  rig.memory().keep_released_blocks();
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  for (TensorId id = 1; id <= 3; ++id) rig.add(id, kBytes);
  ex.before_op(0, {}, 0);  // evicts 1; its block is over the budget, so it goes back at once
  ASSERT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(rig.memory().kept_bytes(), 0u);
  const TensorId away[] = {1};
  ex.fetch(away);  // evicts 2, and 1 comes back into 2's block
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_EQ(rig.memory().blocks_reused(), 1);
  EXPECT_EQ(rig.memory().kept_bytes(), 0u);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_LE(ex.resident_bytes(), ex.budget());
  EXPECT_EQ(ex.end_step().evictions, 2u);
}

TEST(ExecutorKeptBlock, AKeptBlockCountsAgainstTheBudgetAndGoesBackBeforeAnyTensorMoves) {
  Rig rig(3 * kBytes);
  Executor& ex = planned_with_one_away(rig);
  // Below the budget the block stays, from one executor call to the next.
  EXPECT_EQ(rig.memory().kept_bytes(), kBytes);
  ex.before_op(1, {}, 0);
  EXPECT_EQ(rig.memory().kept_bytes(), kBytes);
  // An operator's 2 blocks of outputs fit once the kept one goes back: nothing is evicted.
  ex.before_op(2, {}, 2 * kBytes);
  EXPECT_EQ(rig.memory().kept_bytes(), 0u);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_EQ(ex.end_step().evictions, 0u);
}

TEST(ExecutorKeptBlock, APlannedPrefetchTakesABlockKeptInAnEarlierCall) {
  Rig rig(3 * kBytes);
  Executor& ex = planned_with_one_away(rig, OpIndex{2});
  ex.before_op(1, {});
  ex.after_op(1, {});
  ASSERT_EQ(rig.memory().kept_bytes(), kBytes);
  ex.before_op(2, {});  // the prefetch of 1
  EXPECT_EQ(rig.memory().blocks_reused(), 1);
  EXPECT_EQ(rig.memory().kept_bytes(), 0u);
  ex.after_op(2, {});
  const TensorId one[] = {1};
  ex.before_op(3, one);
  EXPECT_TRUE(rig.memory().intact(1));
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.planned_prefetches, 1u);
  EXPECT_EQ(stats.demand_fetches, 0u);
}

TEST(ExecutorKeptBlock, NoneIsKeptBetweenStepsOrWithoutABudget) {
  Rig rig(3 * kBytes);
  Executor& ex = planned_with_one_away(rig);
  ASSERT_EQ(rig.memory().kept_bytes(), kBytes);
  static_cast<void>(ex.end_step());
  EXPECT_EQ(rig.memory().kept_bytes(), 0u);

  Rig unlimited(0);
  planned_with_one_away(unlimited);  // its drain() is an executor call: the block goes back there
  EXPECT_EQ(unlimited.memory().kept_bytes(), 0u);
}

TEST(ExecutorKeptBlock, ARefusedAllocationGivesKeptBlocksBackBeforeItsRetry) {
  Rig rig(4 * kBytes);
  rig.memory().keep_released_blocks();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  rig.add(3, 2 * kBytes);
  Executor& ex = rig.executor();
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 0), offload(3, 2 * kBytes, plan::Tier::kHost, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(0, {});
  ex.drain();
  ASSERT_EQ(rig.memory().kept_bytes(), 3 * kBytes);
  // Room for 2 blocks of outputs: the larger kept block goes back, the smaller stays.
  ex.before_op(1, {}, 2 * kBytes);
  ASSERT_EQ(rig.memory().kept_bytes(), kBytes);
  // 3 fits the budget with the small block still kept, but the allocator refuses it once:
  // the retry gives the kept block back and moves 2 out before trying again.
  rig.memory().refuse_allocations(1);
  const TensorId three[] = {3};
  ex.fetch(three);
  EXPECT_TRUE(rig.memory().intact(3));
  EXPECT_EQ(rig.memory().kept_bytes(), 0u);
  EXPECT_EQ(rig.memory().trims(), 1);
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_EQ(ex.end_step().allocation_retries, 1u);
}

}  // namespace
}  // namespace teraio::runtime
