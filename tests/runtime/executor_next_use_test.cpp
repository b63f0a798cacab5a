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
using testing::trace_of;

constexpr std::uint64_t kBytes = 16 * kKiB;

trace::Tensor tensor(TensorId id, std::vector<OpIndex> uses, bool persistent) {
  return testing::traced(id, kBytes, std::move(uses), persistent);
}

// Four operators. Tensor 1 is used at 0 and 3, tensor 2 (persistent) at 1 only, so its next use
// is in the next step; tensor 3 is made by operator 2, when the budget of two tensors is full.
trace::Trace four_operators() {
  return trace_of({tensor(1, {0, 3}, false), tensor(2, {1}, true), tensor(3, {2, 3}, false)}, 4);
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

TEST(ExecutorNextUse, ReactiveStepsAndPlannedStepsWithoutNextUsesEvictTheLeastRecentlyUsed) {
  for (const bool planned : {false, true}) {
    Rig rig(2 * kBytes);
    Executor& ex = rig.executor();
    rig.add(1, kBytes);
    rig.add(2, kBytes);
    ex.set_plan(plan_of({}));
    // A reactive step ignores what the trace says; a planned one without next uses has nothing
    // else to go by.
    if (!planned) ex.set_next_uses(NextUses(four_operators()));
    ex.set_mode(planned ? Mode::kPlanned : Mode::kReactive);
    const StepStats stats = run_step(ex, rig);
    EXPECT_EQ(stats.evictions, 2u) << planned;  // 1 at operator 2, then 2 for 1's return
    EXPECT_EQ(stats.demand_fetches, 1u) << planned;
    EXPECT_TRUE(rig.memory().intact(1)) << planned;
  }
}

// Begins a planned step over `trace` on `rig`, whose tensors `ids` are resident.
Executor& planned_step(Rig& rig, const trace::Trace& trace, const std::vector<TensorId>& ids) {
  Executor& ex = rig.executor();
  for (const TensorId id : ids) rig.add(id, kBytes);
  ex.set_plan(plan_of({}));
  ex.set_next_uses(NextUses(trace));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  return ex;
}

// Over the budget at operator 1, with the tensors `resident` (in that use
// order, the first least recently used) idle; returns which of them went.
std::vector<TensorId> evicted_at_operator_1(const trace::Trace& trace,
                                            const std::vector<TensorId>& resident) {
  Rig rig(resident.size() * kBytes);
  Executor& ex = planned_step(rig, trace, resident);
  for (const TensorId id : resident) {
    const TensorId one[] = {id};
    ex.before_op(0, one);
    ex.after_op(0, one);
  }
  ex.before_op(1, {}, kBytes);
  std::vector<TensorId> gone;
  for (const TensorId id : resident) {
    if (ex.location(id) != Location::kDevice) gone.push_back(id);
  }
  static_cast<void>(ex.end_step());
  return gone;
}

TEST(ExecutorNextUse, AmongEquallyDistantNextUsesTheLeastRecentlyUsedGoes) {
  const trace::Trace t = trace_of({tensor(1, {0, 5}, true), tensor(2, {0, 5}, true)}, 8);
  EXPECT_EQ(evicted_at_operator_1(t, {1, 2}), std::vector<TensorId>{1});
  EXPECT_EQ(evicted_at_operator_1(t, {2, 1}), std::vector<TensorId>{2});
}

TEST(ExecutorNextUse, AStepLocalTensorUsedNoMoreGoesLastAndAnUnknownOneFirst) {
  // Tensor 1 is step-local and past its last use (the program still holds it); tensor 2 is
  // persistent, used next in the next step. The held one stays: the program frees it soon.
  const trace::Trace t = trace_of({tensor(1, {0}, false), tensor(2, {0}, true)}, 8);
  EXPECT_EQ(evicted_at_operator_1(t, {2, 1}), std::vector<TensorId>{2});
  // Tensor 9 is not in the trace (the profiled step never used it); tensor 3 is used at 4 and was
  // used before it. The unknown one goes.
  const trace::Trace known = trace_of({tensor(3, {0, 4}, false)}, 8);
  EXPECT_EQ(evicted_at_operator_1(known, {3, 9}), std::vector<TensorId>{9});
}

// Budget of two tensors. Step-local tensor 1 is released at operator 0 (held one operator
// after its use), tensor 2 at 1; persistent tensor 3 is used at 3. The program frees 1 and 2.
TEST(ExecutorNextUse, APlannedStepLooksOnlyAtTheTensorsItsProfileSawFreed) {
  trace::Trace t = trace_of({tensor(1, {0}, false), tensor(2, {0}, false), tensor(3, {3}, true)}, 4);
  t.tensors[1].held_after_use = 1;
  const NextUses next(t);
  EXPECT_EQ(std::vector<TensorId>(next.released_at(0).begin(), next.released_at(0).end()),
            std::vector<TensorId>{1});
  EXPECT_EQ(std::vector<TensorId>(next.released_at(1).begin(), next.released_at(1).end()),
            std::vector<TensorId>{2});
  EXPECT_TRUE(next.released_at(3).empty());  // persistent tensors are never expected freed

  Rig rig(2 * kBytes);
  Executor& ex = planned_step(rig, t, {1, 2, 3});
  const TensorId first[] = {1, 2};
  ex.before_op(0, first);  // over the budget, nothing released yet: tensor 3 goes
  ASSERT_EQ(ex.location(3), Location::kHost);
  ex.after_op(0, first);
  rig.memory().free_silently(1);
  rig.memory().free_silently(2);
  // Tensor 3 comes back: over the budget by one, and only tensor 1 (released at 0) is looked
  // at; it makes the room. Tensor 2 is past operator 1 only after that operator.
  const TensorId third[] = {3};
  ex.before_op(1, third);
  EXPECT_FALSE(ex.contains(1));
  EXPECT_TRUE(ex.contains(2));
  EXPECT_EQ(ex.location(3), Location::kDevice);
  ex.after_op(1, third);
  // A new output at operator 2: tensor 2 is looked at now and forgotten, not copied out.
  ex.before_op(2, {}, 2 * kBytes);
  EXPECT_FALSE(ex.contains(2));
  EXPECT_EQ(rig.memory().copy_outs(2), 0);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.freed_scans, 0u);  // never every tracked tensor
  EXPECT_EQ(stats.evictions, 2u);    // 3 at operator 0, then 3 again for operator 2's output
}

TEST(ExecutorNextUse, AStorageHeldPastItsProfiledReleaseIsForgottenOnceFreed) {
  // Budget of three. Step-local tensor 1 is released at 0; persistent 2 and 3 are used next at
  // 4 and 5. The program holds tensor 1 one operator longer than the profile said.
  const trace::Trace t =
      trace_of({tensor(1, {0}, false), tensor(2, {0, 4}, true), tensor(3, {0, 5}, true)}, 8);
  Rig rig(3 * kBytes);
  Executor& ex = planned_step(rig, t, {1, 2, 3});
  const TensorId all[] = {1, 2, 3};
  ex.before_op(0, all);
  ex.after_op(0, all);
  ex.before_op(1, {}, kBytes);  // tensor 1 is alive, so it stays listed; 3, used furthest ahead, goes
  ASSERT_EQ(ex.location(3), Location::kHost);
  ASSERT_TRUE(ex.contains(1));
  rig.memory().free_silently(1);
  ex.before_op(2, {}, 2 * kBytes);  // looked at again: forgotten, and 2 stays
  EXPECT_FALSE(ex.contains(1));
  EXPECT_EQ(ex.location(2), Location::kDevice);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.freed_scans, 0u);
}

TEST(ExecutorNextUse, AFreedTensorPickedForEvictionIsForgottenNotCopied) {
  // Tensor 1 is persistent: no profile release lists it, yet the program frees it.
  const trace::Trace t = trace_of({tensor(1, {0, 6}, true), tensor(2, {0, 2}, true)}, 8);
  Rig rig(2 * kBytes);
  Executor& ex = planned_step(rig, t, {1, 2});
  rig.memory().free_silently(1);
  ex.before_op(1, {}, kBytes);  // tensor 1, used furthest ahead, is the victim
  EXPECT_FALSE(ex.contains(1));
  EXPECT_EQ(rig.memory().copy_outs(1), 0);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_EQ(stats.freed_scans, 0u);
}

TEST(NextUses, CountsTheNextStepForPersistentTensorsAndTheNextOperatorForTheRest) {
  const NextUses next(four_operators());
  EXPECT_EQ(next.after(1, 0), 3u);
  EXPECT_EQ(next.after(1, 3), 4u);  // used no more: as if used next, so it goes last
  EXPECT_EQ(next.after(2, 1), 4u + 1u);
  EXPECT_EQ(next.after(3, 0), 2u);
  EXPECT_EQ(next.after(99, 2), NextUses::kNever);  // unknown: the profiled step never used it
  trace::Trace two_steps = four_operators();
  two_steps.step_begins = {0, 2};
  try {
    NextUses{two_steps};
    ADD_FAILURE() << "a two-step trace was taken";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
  }
}

}  // namespace
}  // namespace teraio::runtime
