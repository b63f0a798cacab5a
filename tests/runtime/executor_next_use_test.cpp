// Eviction in a planned step that is over its budget: the idle tensor used furthest ahead goes,
// as in the simulator, not the least recently used one the plan needs again soon.
#include <gtest/gtest.h>

#include <vector>

#include "runtime_test_support.hpp"
#include "teraio/runtime/next_use.hpp"

namespace teraio::runtime {
namespace {

using testing::plan_of;
using testing::Rig;

constexpr std::uint64_t kBytes = 16 * kKiB;

// Four operators. Tensor 1 is used at 0 and 3, tensor 2 (persistent) at 1 only, so its next use
// is in the next step; tensor 3 is made by operator 2, when the budget of two tensors is full.
trace::Trace four_operators() {
  trace::Trace t;
  t.ops.resize(4, trace::Operator{"aten::op", 1e-3});
  auto tensor = [](TensorId id, std::vector<OpIndex> uses, bool persistent) {
    trace::Tensor one;
    one.id = id;
    one.bytes = kBytes;
    one.persistent = persistent;
    one.uses = std::move(uses);
    return one;
  };
  t.tensors = {tensor(1, {0, 3}, false), tensor(2, {1}, true), tensor(3, {2, 3}, false)};
  return t;
}

StepStats run_step(Executor& ex, Rig& rig) {
  ex.begin_step();
  const std::vector<std::vector<TensorId>> used = {{1}, {2}, {}, {1, 3}};
  for (OpIndex k = 0; k < used.size(); ++k) {
    ex.before_op(k, used[k], k == 2 ? kBytes : 0);
    if (k == 2) rig.add(3, kBytes);
    ex.after_op(k, k == 2 ? std::vector<TensorId>{3} : used[k]);
    EXPECT_LE(ex.resident_bytes(), ex.budget()) << "after operator " << k;
  }
  return ex.end_step();
}

TEST(ExecutorNextUse, APlannedStepEvictsTheTensorUsedFurthestAhead) {
  Rig rig(2 * kBytes);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  ex.set_plan(plan_of({}));
  ex.set_next_uses(NextUses(four_operators()));
  ex.set_mode(Mode::kPlanned);
  const StepStats stats = run_step(ex, rig);
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.demand_fetches, 0u);  // tensor 2 went: it is not used again in this step
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
}

TEST(ExecutorNextUse, WithoutAPlanTheLeastRecentlyUsedGoes) {
  for (const Mode mode : {Mode::kReactive, Mode::kPlanned}) {
    Rig rig(2 * kBytes);
    Executor& ex = rig.executor();
    rig.add(1, kBytes);
    rig.add(2, kBytes);
    ex.set_plan(plan_of({}));
    // Reactive mode ignores what the trace says; planned mode without next uses has nothing else.
    if (mode == Mode::kReactive) ex.set_next_uses(NextUses(four_operators()));
    ex.set_mode(mode);
    const StepStats stats = run_step(ex, rig);
    EXPECT_EQ(stats.evictions, 2u) << to_string(mode);  // 1 at operator 2, then 2 for 1's return
    EXPECT_EQ(stats.demand_fetches, 1u) << to_string(mode);
    EXPECT_TRUE(rig.memory().intact(1)) << to_string(mode);
  }
}

TEST(NextUses, CountsTheNextStepForPersistentTensorsAndTheNextOperatorForTheRest) {
  const NextUses next(four_operators());
  EXPECT_EQ(next.after(1, 0), 3u);
  EXPECT_EQ(next.after(1, 3), 4u);  // used no more: as if used next, so it goes last
  EXPECT_EQ(next.after(2, 1), 4u + 1u);
  EXPECT_EQ(next.after(3, 0), 2u);
  EXPECT_EQ(next.after(99, 2), 3u);  // unknown: as if used next, so it goes last
  trace::Trace two_steps = four_operators();
  two_steps.step_begins = {0, 2};
  EXPECT_THROW(NextUses{two_steps}, Error);
}

}  // namespace
}  // namespace teraio::runtime
