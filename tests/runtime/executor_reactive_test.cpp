// Reactive mode (profiling, no plan): the budget holds after every operator by evicting the
// least recently used idle tensor, and what cannot be done is refused with the numbers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime_test_support.hpp"

namespace teraio::runtime {
namespace {

using testing::Rig;
using testing::RigOptions;

constexpr std::uint64_t kBytes = 16 * kKiB;

bool mentions(const Error& e, std::uint64_t number) {
  return std::string(e.what()).find(std::to_string(number)) != std::string::npos;
}

TEST(ExecutorReactive, EvictsLeastRecentlyUsedAndHoldsTheBudget) {
  RigOptions options;
  options.host_capacity = 2 * kBytes;  // the third eviction goes to the SSD
  Rig rig(3 * kBytes, options);
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  rig.add(3, kBytes);
  const std::vector<std::vector<TensorId>> ops = {{1}, {4}, {2}, {5}, {1, 3}};
  std::vector<TensorId> produced = {0, 4, 0, 5, 0};
  for (OpIndex k = 0; k < ops.size(); ++k) {
    ex.before_op(k, ops[k]);
    EXPECT_LE(ex.resident_bytes(), ex.budget()) << "before operator " << k;
    for (TensorId id : ops[k]) {
      if (!ex.contains(id)) continue;  // an output, produced by the operator
      EXPECT_TRUE(rig.memory().intact(id)) << "tensor " << id << " at " << k;
    }
    if (produced[k] != 0) rig.add(produced[k], kBytes);
    ex.after_op(k, ops[k]);
    EXPECT_LE(ex.resident_bytes(), ex.budget()) << "after operator " << k;
    if (k == 1) {
      // Use order so far: 2, 3, 1, 4: the oldest idle one, 2, went first.
      EXPECT_EQ(ex.location(2), Location::kHost);
      EXPECT_EQ(ex.location(3), Location::kDevice);
    }
  }
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.evictions, 5u);              // 2, 3, 1, then 4 and 2 to make room at op 4
  EXPECT_EQ(stats.demand_fetches, 3u);         // 2 at op 2, 1 and 3 at op 4
  EXPECT_LE(stats.peak_resident, 4 * kBytes);  // a new output lands before after_op can evict
  EXPECT_GT(stats.bytes_to_ssd, 0u);
  for (const TransferSpan& span : stats.transfers) EXPECT_FALSE(span.planned);
  for (TensorId id : {1, 2, 3, 4, 5}) {
    const TensorId one[] = {id};
    ex.fetch(one);
    EXPECT_TRUE(rig.memory().intact(id)) << "tensor " << id;
    EXPECT_LE(ex.resident_bytes(), ex.budget());
  }
}

TEST(ExecutorReactive, FreedTensorsAreForgottenNotEvicted) {
  Rig rig(2 * kBytes);
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  rig.memory().free_silently(1);  // the oldest, so the first eviction candidate
  const std::vector<TensorId> used = {2};
  ex.before_op(0, used, kBytes);  // room for a new output: tensor 1 no longer counts
  EXPECT_FALSE(ex.contains(1));
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_EQ(ex.resident_bytes(), kBytes);
  EXPECT_EQ(rig.memory().copy_outs(1), 0);
  EXPECT_EQ(ex.end_step().evictions, 0u);
}

// A reactive step begun on `rig`, with tensors 1..count of kBytes each.
Executor& reactive_step_with(Rig& rig, TensorId count) {
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  for (TensorId id = 1; id <= count; ++id) rig.add(id, kBytes);
  return ex;
}

TEST(ExecutorReactive, LooksForFreedTensorsOncePerCall) {
  Rig rig(2 * kBytes);
  Executor& ex = reactive_step_with(rig, 4);
  ex.before_op(0, {}, 0);  // scan 1 (nothing freed), then evicts 1 and 2: the budget holds two
  ASSERT_EQ(ex.location(1), Location::kHost);
  ASSERT_EQ(ex.location(2), Location::kHost);
  rig.memory().free_silently(3);
  // Two demand fetches in one call, each over the budget: the first scans (scan 2) and
  // forgets 3; the second does not scan again and evicts 4, the only idle tensor.
  const TensorId away[] = {1, 2};
  ex.fetch(away);
  EXPECT_FALSE(ex.contains(3));
  EXPECT_EQ(rig.memory().copy_outs(3), 0);
  ASSERT_EQ(ex.location(4), Location::kHost);
  // A new output puts the step over the budget after its operator: after_op scans (scan 3).
  rig.add(5, kBytes);
  ex.after_op(0, {});
  // A later call scans again (scan 4): tensor 4, freed since, is forgotten.
  rig.memory().free_silently(4);
  ex.before_op(1, {}, kBytes);
  EXPECT_FALSE(ex.contains(4));
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.freed_scans, 4u);
  EXPECT_GT(stats.freed_scan_s, 0.0);
}

TEST(ExecutorReactive, ManyTensorsStayFast) {
  RigOptions options;
  options.host_capacity = 16 * kMiB;
  Rig rig(64 * 4096, options);
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  for (TensorId id = 1; id <= 3000; ++id) rig.add(id, 4096);
  const TensorId used[] = {3000};
  ex.before_op(0, used);
  EXPECT_LE(ex.resident_bytes(), ex.budget());
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(ex.location(3000), Location::kDevice);
}

TEST(ExecutorReactive, FetchAllRefusesWhatCannotFitBeforeMovingAnything) {
  Rig rig(2 * kBytes);
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  for (TensorId id : {1, 2, 3}) rig.add(id, kBytes);
  ex.after_op(0, {});
  ASSERT_EQ(ex.location(1), Location::kHost);
  try {
    ex.fetch_all();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInfeasible);
    EXPECT_TRUE(mentions(e, 3 * kBytes)) << e.what();
    EXPECT_TRUE(mentions(e, 2 * kBytes)) << e.what();
  }
  EXPECT_EQ(ex.location(1), Location::kHost);
  ex.remove_tensor(3);
  ex.fetch_all();
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_TRUE(rig.memory().intact(2));
  EXPECT_EQ(ex.resident_bytes(), 2 * kBytes);
}

TEST(ExecutorReactive, BothTiersFullIsTierFullNamingTheBudget) {
  RigOptions options;
  options.host_capacity = 0;
  options.ssd_capacity = 64 * kKiB;
  Rig rig(64 * kKiB, options);
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  for (TensorId id : {1, 2, 3}) rig.add(id, 48 * kKiB);
  try {
    ex.after_op(0, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTierFull);
    EXPECT_TRUE(mentions(e, 64 * kKiB)) << e.what();
  }
  EXPECT_EQ(ex.location(1), Location::kSsd);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(2));
}

TEST(ExecutorReactive, NothingIdleToEvictIsInfeasible) {
  Rig rig(kBytes);
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  const TensorId used[] = {1, 2};
  try {
    ex.before_op(0, used);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInfeasible);
    EXPECT_TRUE(mentions(e, 2 * kBytes)) << e.what();
  }
}

TEST(ExecutorReactive, EmptyTensorsAreNotEvicted) {
  Rig rig(kBytes);
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  rig.add(1, 0);
  rig.add(2, kBytes);
  rig.add(3, kBytes);
  ex.after_op(0, {});
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_EQ(ex.location(3), Location::kDevice);
}

TEST(ExecutorReactive, PassiveModeNeverEvicts) {
  Rig rig(kBytes);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  ex.after_op(0, {});
  EXPECT_EQ(ex.resident_bytes(), 2 * kBytes);
}

// The device allocator may refuse a block although the tracked tensors are within the budget
// (untracked memory, fragmentation): the fetch moves as many bytes again out, trims the
// allocator's cache and retries once.
// A reactive step over a budget of `count` tensors of kBytes holding tensors 1..count, whose
// operator 0 makes one more: tensor 1, the least recently used, goes out to make room.
void fill_and_push_the_first_out(Rig& rig, TensorId count) {
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  for (TensorId id = 1; id <= count; ++id) rig.add(id, kBytes);
  ex.before_op(0, std::vector<TensorId>{count + 1});
  rig.add(count + 1, kBytes);
  ex.after_op(0, std::vector<TensorId>{count + 1});
  ASSERT_EQ(ex.location(1), Location::kHost);
}

TEST(ExecutorReactive, RefusedAllocationMovesMoreOutAndRetries) {
  Rig rig(3 * kBytes);
  Executor& ex = rig.executor();
  ASSERT_NO_FATAL_FAILURE(fill_and_push_the_first_out(rig, 3));
  rig.memory().refuse_allocations(1);
  const std::vector<TensorId> uses{1};
  ex.before_op(1, uses);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(rig.memory().trims(), 1);
  // 2 made room within the budget, 3 (the next least recently used) the room beyond it.
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_EQ(ex.location(3), Location::kHost);
  EXPECT_EQ(ex.resident_bytes(), 2 * kBytes);
  ex.after_op(1, uses);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.allocation_retries, 1u);
  EXPECT_EQ(stats.demand_fetches, 1u);
}

TEST(ExecutorReactive, SecondRefusalIsRaisedAndTheTensorStaysInItsTier) {
  Rig rig(2 * kBytes);
  Executor& ex = rig.executor();
  ASSERT_NO_FATAL_FAILURE(fill_and_push_the_first_out(rig, 2));
  rig.memory().refuse_allocations(2);
  const std::vector<TensorId> uses{1};
  try {
    ex.before_op(1, uses);
    ADD_FAILURE() << "a second refusal must be raised";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory) << e.what();
  }
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_FALSE(rig.memory().holds(1));
  // Once the allocator gives memory again, the bytes come back intact.
  ex.fetch(uses);
  EXPECT_TRUE(rig.memory().intact(1));
  static_cast<void>(ex.end_step());
}

}  // namespace
}  // namespace teraio::runtime
