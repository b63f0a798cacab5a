// Spare blocks (TensorMemory::spare_bytes, the torch session's reuse_blocks): the memory of a
// tensor moved out stays with the memory for a later fetch of its size. It counts against the
// budget, goes back before any tensor is moved out for room or an allocation is retried, and is
// never kept outside a step, in passive mode or without a budget.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "runtime_test_support.hpp"

namespace teraio::runtime {
namespace {

using testing::offload;
using testing::plan_of;
using testing::prefetch;
using testing::Rig;

constexpr std::uint64_t kBytes = 16 * kKiB;

// A planned step over tensors of `sizes` (ids 1, 2, ...) whose plan moves `away` out at
// operator 0 (and, with `back_at`, brings the first of them back there for its use one
// operator later); returns once operator 0's copies out are issued.
Executor& planned_moving_out(Rig& rig, const std::vector<std::uint64_t>& sizes,
                             const std::vector<TensorId>& away,
                             std::optional<OpIndex> back_at = std::nullopt) {
  rig.memory().keep_released_blocks();
  for (std::size_t i = 0; i < sizes.size(); ++i) rig.add(static_cast<TensorId>(i + 1), sizes[i]);
  std::vector<plan::Migration> migrations;
  for (const TensorId id : away) migrations.push_back(offload(id, sizes[id - 1], plan::Tier::kHost, 0));
  if (back_at)
    migrations.push_back(prefetch(away[0], sizes[away[0] - 1], plan::Tier::kHost, *back_at, *back_at + 1));
  Executor& ex = rig.executor();
  ex.set_plan(plan_of(migrations));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(0, {});
  return ex;
}

// The same, returning once the tensors are away.
Executor& planned_with_away(Rig& rig, const std::vector<std::uint64_t>& sizes,
                            const std::vector<TensorId>& away,
                            std::optional<OpIndex> back_at = std::nullopt) {
  Executor& ex = planned_moving_out(rig, sizes, away, back_at);
  ex.drain();
  for (const TensorId id : away) EXPECT_EQ(ex.location(id), Location::kHost);
  return ex;
}

TEST(ExecutorSpareBlock, AFetchTakesTheBlockOfAnEvictionOfItsSize) {
  Rig rig(2 * kBytes);
  rig.memory().keep_released_blocks();
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  for (TensorId id = 1; id <= 3; ++id) rig.add(id, kBytes);
  ex.before_op(0, {}, 0);  // evicts 1; its block is over the budget, so it goes back at once
  ASSERT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
  rig.memory().reset_peak_held();
  const TensorId away[] = {1};
  ex.fetch(away);  // evicts 2, and 1 comes back into 2's block
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_EQ(rig.memory().blocks_reused(), 1);
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_LE(rig.memory().peak_held(), ex.budget());
  EXPECT_EQ(ex.end_step().evictions, 2u);
}

TEST(ExecutorSpareBlock, ASpareBlockCountsAgainstTheBudgetAndGoesBackBeforeAnyTensorMoves) {
  Rig rig(3 * kBytes);
  Executor& ex = planned_with_away(rig, {kBytes, kBytes}, {1});
  // Below the budget the block stays, from one executor call to the next.
  EXPECT_EQ(rig.memory().spare_bytes(), kBytes);
  ex.before_op(1, {}, 0);
  EXPECT_EQ(rig.memory().spare_bytes(), kBytes);
  // An operator's 2 blocks of outputs fit once the spare one goes back: nothing is evicted.
  ex.before_op(2, {}, 2 * kBytes);
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_EQ(ex.end_step().evictions, 0u);
}

TEST(ExecutorSpareBlock, APrefetchAtTheBudgetsEdgeTakesABlockSparedInAnEarlierCall) {
  // The budget holds both tensors: the prefetch fits only by taking 1's own spare block.
  Rig rig(2 * kBytes);
  Executor& ex = planned_with_away(rig, {kBytes, kBytes}, {1}, OpIndex{2});
  ex.after_op(0, {});
  ex.before_op(1, {});
  ex.after_op(1, {});
  ASSERT_EQ(rig.memory().spare_bytes(), kBytes);
  ex.before_op(2, {});  // the prefetch of 1
  EXPECT_EQ(rig.memory().blocks_reused(), 1);
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
  ex.after_op(2, {});
  const TensorId one[] = {1};
  ex.before_op(3, one);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_LE(rig.memory().peak_held(), ex.budget());
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.planned_prefetches, 1u);
  EXPECT_EQ(stats.demand_fetches, 0u);
  EXPECT_EQ(stats.evictions, 0u);
}

TEST(ExecutorSpareBlock, TheBlockAFetchWillTakeStaysWhenOthersGoBack) {
  // Spare: a block of 1 (two units) and one of 3; the fetch of 1 over the budget gives 3's back.
  Rig rig(4 * kBytes);
  Executor& ex = planned_with_away(rig, {2 * kBytes, kBytes, kBytes}, {1, 3});
  ASSERT_EQ(rig.memory().spare_bytes(), 3 * kBytes);
  rig.add(4, kBytes);
  const TensorId one[] = {1};
  ex.fetch(one);
  EXPECT_EQ(rig.memory().blocks_reused(), 1);
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_EQ(ex.location(4), Location::kDevice);
}

TEST(ExecutorSpareBlock, NoneIsKeptAtAStepsEndOrWithoutABudget) {
  Rig rig(3 * kBytes);
  Executor& ex = planned_with_away(rig, {kBytes, kBytes}, {1});
  ASSERT_EQ(rig.memory().spare_bytes(), kBytes);
  static_cast<void>(ex.end_step());
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);

  Rig unlimited(0);
  planned_with_away(unlimited, {kBytes, kBytes}, {1});  // its drain() is a call: the block goes back there
  EXPECT_EQ(unlimited.memory().spare_bytes(), 0u);
}

TEST(ExecutorSpareBlock, NoneIsKeptByACallBetweenSteps) {
  // A copy out planned late in a step is retired by a call after the step (the session fetches
  // for operators between steps too): its block must not stay while the program allocates.
  Rig rig(3 * kBytes);
  Executor& ex = planned_moving_out(rig, {kBytes, kBytes}, {1});
  static_cast<void>(ex.end_step());
  const TensorId two[] = {2};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ex.location(1) != Location::kHost && std::chrono::steady_clock::now() < until) {
    ex.fetch(two);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
}

TEST(ExecutorSpareBlock, NoneIsKeptInPassiveModeUnderABudget) {
  Rig rig(3 * kBytes);
  Executor& ex = planned_moving_out(rig, {kBytes, kBytes}, {1});
  ex.set_mode(Mode::kPassive);
  ex.drain();
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
}

// Tensor 3 (two blocks) is away and one block is spare, and the allocator refuses the next
// `refusals` allocations; then 3 is fetched. The budget holds 3 with the small block still spare.
Executor& fetch_under_refusals(Rig& rig, int refusals) {
  Executor& ex = planned_with_away(rig, {kBytes, kBytes, 2 * kBytes}, {1, 3});
  EXPECT_EQ(rig.memory().spare_bytes(), 3 * kBytes);
  // Room for 2 blocks of outputs: the larger spare block goes back, the smaller stays.
  ex.before_op(1, {}, 2 * kBytes);
  EXPECT_EQ(rig.memory().spare_bytes(), kBytes);
  rig.memory().refuse_allocations(refusals);
  const TensorId three[] = {3};
  ex.fetch(three);
  EXPECT_TRUE(rig.memory().intact(3));
  return ex;
}

TEST(ExecutorSpareBlock, ARefusedAllocationIsRetriedWithTheSpareBlocksBackBeforeAnythingMoves) {
  Rig rig(4 * kBytes);
  Executor& ex = fetch_under_refusals(rig, 1);
  // The spare block went back, and the retry succeeded without moving 2 out.
  EXPECT_EQ(rig.memory().spare_bytes(), 0u);
  EXPECT_EQ(rig.memory().trims(), 0);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_EQ(ex.end_step().allocation_retries, 1u);
}

TEST(ExecutorSpareBlock, ASecondRefusalMovesTensorsOutAsWithoutSpareBlocks) {
  Rig rig(4 * kBytes);
  Executor& ex = fetch_under_refusals(rig, 2);
  EXPECT_EQ(rig.memory().trims(), 1);
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_EQ(ex.end_step().allocation_retries, 1u);
}

}  // namespace
}  // namespace teraio::runtime
