// Carrying out a plan: offloads free device memory once written, prefetches bring the exact
// bytes back from either tier, and a wrong plan costs a demand fetch, never correctness.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
#include <vector>

#include "runtime_test_support.hpp"

namespace teraio::runtime {
namespace {

using namespace std::chrono_literals;
using testing::offload;
using testing::plan_of;
using testing::prefetch;
using testing::Rig;
using testing::RigOptions;

constexpr std::uint64_t kBytes = 40 * kKiB + 123;  // not a page multiple: partial last page

TEST(ExecutorPlan, OffloadAndPrefetchThroughBothTiersRestoreEveryByte) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  rig.add(3, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 1), offload(2, kBytes, plan::Tier::kSsd, 1),
               prefetch(1, kBytes, plan::Tier::kHost, 3, 4), prefetch(2, kBytes, plan::Tier::kSsd, 3, 4)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const TensorId all[] = {1, 2, 3};
  ex.before_op(0, all);
  ex.after_op(0, all);
  ex.before_op(1, {});
  EXPECT_EQ(ex.location(1), Location::kOffloading);
  ex.drain();
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(ex.location(2), Location::kSsd);
  EXPECT_FALSE(rig.memory().holds(1));
  EXPECT_FALSE(rig.memory().holds(2));
  EXPECT_EQ(ex.resident_bytes(), kBytes);
  EXPECT_GT(rig.host_used(), 0u);
  EXPECT_GT(rig.ssd_used(), 0u);
  ex.after_op(1, {});
  ex.before_op(2, {});
  ex.after_op(2, {});
  ex.before_op(3, {});
  ex.after_op(3, {});
  ex.before_op(4, all);
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  ex.after_op(4, all);
  const StepStats stats = ex.end_step();

  for (TensorId id : all) EXPECT_TRUE(rig.memory().intact(id)) << "tensor " << id;
  EXPECT_EQ(stats.planned_offloads, 2u);
  EXPECT_EQ(stats.planned_prefetches, 2u);
  EXPECT_EQ(stats.demand_fetches, 0u);
  EXPECT_EQ(stats.skipped, 0u);
  EXPECT_EQ(stats.bytes_to_host, kBytes);
  EXPECT_EQ(stats.bytes_to_ssd, kBytes);
  EXPECT_EQ(stats.bytes_from_host, kBytes);
  EXPECT_EQ(stats.bytes_from_ssd, kBytes);
  EXPECT_EQ(stats.peak_resident, 3 * kBytes);
  EXPECT_EQ(stats.mode, Mode::kPlanned);
  ASSERT_EQ(stats.transfers.size(), 4u);
  for (const TransferSpan& span : stats.transfers) {
    EXPECT_TRUE(span.planned);
    EXPECT_EQ(span.bytes, kBytes);
    EXPECT_LE(span.start_s, span.end_s);
  }
  // The extents are given back once the tensors are home again.
  EXPECT_EQ(rig.host_used(), 0u);
  EXPECT_EQ(rig.ssd_used(), 0u);
  EXPECT_EQ(ex.resident_bytes(), 3 * kBytes);
}

// Next uses from a trace of `ops` operators in which each tensor of `uses` is used at the listed
// operators; those in `persistent` live across steps (position_for_plan sends out only these).
NextUses next_uses_of(std::vector<std::pair<TensorId, std::vector<OpIndex>>> uses,
                      std::vector<TensorId> persistent, std::size_t ops) {
  trace::Trace t;
  t.ops.resize(ops, trace::Operator{"aten::op", 1e-3});
  for (auto& [id, at] : uses) {
    trace::Tensor one;
    one.id = id;
    one.bytes = kBytes;
    one.uses = std::move(at);
    one.persistent = std::find(persistent.begin(), persistent.end(), id) != persistent.end();
    t.tensors.push_back(std::move(one));
  }
  return NextUses(t);
}

// Runs operators 0 .. ops - 1 of a step, operator k using used_at[k] (none where absent).
void run_ops(Executor& ex, OpIndex ops, const std::map<OpIndex, std::vector<TensorId>>& used_at) {
  for (OpIndex k = 0; k < ops; ++k) {
    const auto found = used_at.find(k);
    const std::vector<TensorId> used = found == used_at.end() ? std::vector<TensorId>{} : found->second;
    ex.before_op(k, used);
    ex.after_op(k, used);
  }
}

// A plan whose last migration of a tensor is an offload has it away at every step's start. The
// first planned step after a reactive one finds it on the device: position_for_plan sends it
// out before operator 0, so the step starts where the plan does; later steps find it away.
TEST(ExecutorPlan, PositioningStartsTheFirstPlannedStepWithTheTensorsThePlanHasAway) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);  // prefetched at 1 for 2, offloaded again at 3: away at the step's start
  rig.add(2, kBytes);  // offloaded at 1, prefetched at 3: on the device at the step's start
  ex.set_plan(
      plan_of({prefetch(1, kBytes, plan::Tier::kHost, 1, 2), offload(1, kBytes, plan::Tier::kHost, 3),
               offload(2, kBytes, plan::Tier::kHost, 1), prefetch(2, kBytes, plan::Tier::kHost, 3, 4)}));
  ex.set_next_uses(next_uses_of({{1, {2}}, {2, {4}}}, {1, 2}, 5));
  ex.set_mode(Mode::kPlanned);
  const auto step = [&] {
    ex.begin_step();
    const std::uint64_t positioned = ex.position_for_plan();
    ex.drain();  // the copy out done, so that the plan's prefetch reads it back (not a take-back)
    const Location at_start = ex.location(1);
    const Location other_at_start = ex.location(2);
    run_ops(ex, 5, {{2, {1}}, {4, {2}}});
    ex.drain();
    return std::tuple{positioned, at_start, other_at_start, ex.end_step()};
  };
  const auto [count, first_at_start, first_other, first] = step();
  EXPECT_EQ(count, 1u);
  EXPECT_EQ(first_at_start, Location::kHost);
  EXPECT_EQ(first_other, Location::kDevice);
  EXPECT_EQ(first.positioned, 1u);
  EXPECT_EQ(first.bytes_to_host, 3 * kBytes);  // positioned, then the plan's two offloads
  EXPECT_GE(first.bytes_from_host, kBytes);    // tensor 1 came back from the host tier
  EXPECT_EQ(first.demand_fetches, 0u);
  EXPECT_EQ(first.evictions, 0u);
  EXPECT_EQ(first.skipped, 0u);  // the prefetch of 1 found it away, as planned
  // Positioning again finds nothing to send: the step ended in the plan's start state.
  const auto [again, second_at_start, second_other, second] = step();
  EXPECT_EQ(again, 0u);
  EXPECT_EQ(second_at_start, Location::kHost);
  EXPECT_EQ(second.positioned, 0u);
  EXPECT_EQ(second.bytes_to_host, 2 * kBytes);
  EXPECT_EQ(second.skipped, 0u);
  // Every byte survived: a reactive step brings both back.
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  const TensorId both[] = {1, 2};
  ex.before_op(0, both);
  for (const TensorId id : both) EXPECT_TRUE(rig.memory().intact(id)) << "tensor " << id;
  ex.after_op(0, both);
  ex.end_step();
}

// Without positioning the same first step starts with tensor 1 on the device: its planned
// prefetch is skipped (nothing to fetch) and the plan's memory at the start is short by its size.
TEST(ExecutorPlan, WithoutPositioningTheFirstPlannedStepStartsWithTheTensorOnTheDevice) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(
      plan_of({prefetch(1, kBytes, plan::Tier::kHost, 1, 2), offload(1, kBytes, plan::Tier::kHost, 3)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  EXPECT_EQ(ex.location(1), Location::kDevice);
  run_ops(ex, 4, {{2, {1}}});
  ex.drain();
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.positioned, 0u);
  EXPECT_EQ(stats.skipped, 1u);
  EXPECT_EQ(stats.bytes_to_host, kBytes);
}

// Under a budget with room for two of the three tensors and nothing more, operator 0's new
// output needs the room of tensor 1, which the plan has away at the step's start. Without
// positioning the step evicts it; positioned it is already on its way and nothing is evicted.
// Tensor 3 is step-local (not persistent): it stays, whatever the plan does with it.
TEST(ExecutorPlan, PositioningSendsOutWhatTheFirstOperatorWouldOtherwiseEvict) {
  for (const bool position : {false, true}) {
    Rig rig(3 * kBytes);
    Executor& ex = rig.executor();
    rig.add(1, kBytes);
    rig.add(2, kBytes);
    rig.add(3, kBytes);
    ex.set_plan(
        plan_of({prefetch(1, kBytes, plan::Tier::kHost, 1, 2), offload(1, kBytes, plan::Tier::kHost, 3),
                 offload(3, kBytes, plan::Tier::kHost, 3)}));
    ex.set_next_uses(next_uses_of({{1, {2}}, {2, {0}}, {3, {3}}}, {1, 2}, 4));
    ex.set_mode(Mode::kPlanned);
    ex.begin_step();
    if (position) {
      EXPECT_EQ(ex.position_for_plan(), 1u);
    }
    EXPECT_EQ(ex.location(3), Location::kDevice) << position;
    const TensorId uses[] = {2};
    ex.before_op(0, uses, kBytes);  // an output of kBytes is about to be born
    ex.after_op(0, uses);
    const StepStats stats = ex.end_step();
    EXPECT_EQ(stats.positioned, position ? 1u : 0u);
    EXPECT_EQ(stats.evictions, position ? 0u : 1u) << position;
    ex.drain();
  }
}

// One planned step of one operator that sends `out` away before it, then an empty plan (one
// that keeps everything on the device). With `finish`, the copies out are done when it returns;
// without, they may still run (a slow SSD keeps them under way).
void step_sending_out(Executor& ex, std::vector<plan::Migration> out, bool finish = true) {
  ex.set_plan(plan_of(std::move(out)));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  run_ops(ex, 1, {});
  if (finish) ex.drain();
  ex.end_step();
  ex.set_plan(plan_of({}));
}

// Sends tensors 1 and 2 (kBytes each) out for good (1 to the host tier, 2 to `second`), leaving
// an empty plan.
void leave_two_away(Executor& ex, plan::Tier second = plan::Tier::kHost) {
  step_sending_out(ex, {offload(1, kBytes, plan::Tier::kHost, 0), offload(2, kBytes, second, 0)});
}

// A step before the plan's first one (a reactive step, or another plan) can leave away tensors
// that the plan has on the device at every step's start. Positioning fetches them back, in the
// order of their first use and as far as the budget has room without evicting; those it leaves
// away are fetched on demand. A plan whose start is over the budget is not followed there.
TEST(ExecutorPlan, PositioningFetchesBackWhatTheStepBeforeLeftAway) {
  enum class Case { kNoBudget, kRoomForOne, kPlanStartsOverBudget };
  for (const Case c : {Case::kNoBudget, Case::kRoomForOne, Case::kPlanStartsOverBudget}) {
    SCOPED_TRACE(static_cast<int>(c));
    // Room for one: tensor 4, which the plan does not know (a step-local storage still
    // alive), holds the room of a second one.
    const std::uint64_t budget = c == Case::kNoBudget ? 0 : c == Case::kRoomForOne ? 3 * kBytes : 2 * kBytes;
    Rig rig(budget);
    Executor& ex = rig.executor();
    rig.add(1, kBytes);
    rig.add(2, kBytes);
    rig.add(3, kBytes);
    leave_two_away(ex, plan::Tier::kSsd);
    ASSERT_EQ(ex.location(1), Location::kHost);
    ASSERT_EQ(ex.location(2), Location::kSsd);
    if (c == Case::kRoomForOne) rig.add(4, kBytes);
    // The new plan keeps 1, 2 and 3 on the device: 2 is used first, then 1, then 3.
    ex.set_next_uses(next_uses_of({{1, {2}}, {2, {1}}, {3, {3}}}, {1, 2, 3}, 4));
    ex.begin_step();
    const std::uint64_t moved = ex.position_for_plan();
    ex.drain();
    const Location first = ex.location(1), second = ex.location(2);
    run_ops(ex, 4, {{1, {2}}, {2, {1}}, {3, {3}}});
    const StepStats stats = ex.end_step();
    ex.drain();
    for (const TensorId id : {1, 2, 3}) {  // one by one: all three may be over the budget
      ex.fetch(std::span<const TensorId>(&id, 1));
      EXPECT_TRUE(rig.memory().intact(id)) << "tensor " << id;
    }
    EXPECT_EQ(stats.positioned, 0u);
    switch (c) {
      case Case::kNoBudget:
        // Both come back, and no operator waits for one.
        EXPECT_EQ(moved, 2u);
        EXPECT_EQ(stats.positioned_back, 2u);
        EXPECT_EQ(first, Location::kDevice);
        EXPECT_EQ(second, Location::kDevice);
        EXPECT_EQ(stats.demand_fetches, 0u);
        EXPECT_EQ(stats.evictions, 0u);
        EXPECT_EQ(stats.bytes_from_host, kBytes);
        EXPECT_EQ(stats.bytes_from_ssd, kBytes);
        break;
      case Case::kRoomForOne:
        // The one used first (2) comes back; 1 waits for its operator.
        EXPECT_EQ(moved, 1u);
        EXPECT_EQ(stats.positioned_back, 1u);
        EXPECT_EQ(second, Location::kDevice);
        EXPECT_EQ(first, Location::kHost);
        EXPECT_EQ(stats.demand_fetches, 1u);
        break;
      case Case::kPlanStartsOverBudget:
        // Three tensors at the start, room for two: both stay away until their operators.
        EXPECT_EQ(moved, 0u);
        EXPECT_EQ(stats.positioned_back, 0u);
        EXPECT_EQ(second, Location::kSsd);
        EXPECT_EQ(first, Location::kHost);
        EXPECT_EQ(stats.demand_fetches, 2u);
        break;
    }
  }
}

// Positioning never moves anything out to fetch back: an allocator that refuses the block ends
// it (its tensors then come back on demand), and a tensor freed meanwhile is passed over.
TEST(ExecutorPlan, PositioningBackNeitherEvictsForARefusedBlockNorTripsOnAFreedTensor) {
  {
    Rig rig(0);
    rig.add(1, kBytes);
    rig.add(2, kBytes);
    rig.add(3, kBytes);  // on the device throughout: a victim, were positioning to make room
    Executor& ex = rig.executor();
    leave_two_away(ex);
    ex.set_next_uses(next_uses_of({{1, {1}}, {2, {2}}}, {1, 2}, 3));
    ex.begin_step();
    rig.memory().refuse_allocations(1);
    EXPECT_EQ(ex.position_for_plan(), 0u);
    EXPECT_EQ(ex.location(3), Location::kDevice);
    const StepStats stats = ex.end_step();
    EXPECT_EQ(stats.evictions, 0u);
    EXPECT_EQ(stats.positioned_back, 0u);
  }
  {
    Rig rig(0);
    rig.add(1, kBytes);
    rig.add(2, kBytes);
    Executor& ex = rig.executor();
    leave_two_away(ex);
    ex.set_next_uses(next_uses_of({{1, {1}}, {2, {2}}}, {1, 2}, 3));
    rig.memory().free_silently(1);
    ex.begin_step();
    EXPECT_EQ(ex.position_for_plan(), 1u);
    ex.drain();
    EXPECT_EQ(ex.location(2), Location::kDevice);
    EXPECT_EQ(ex.end_step().positioned_back, 1u);
    EXPECT_TRUE(rig.memory().intact(2));
  }
}

// With spare blocks kept (reuse_blocks), the block of a tensor positioning sends out serves the
// fetch back of one of its size: the budget holds one tensor, and both moves fit it.
TEST(ExecutorPlan, PositioningBackTakesTheSpareBlockOfWhatWentOut) {
  Rig rig(kBytes);
  rig.memory().keep_released_blocks();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  Executor& ex = rig.executor();
  // The step before sends 2 out; the new plan has 1 away at the start and 2 on the device.
  step_sending_out(ex, {offload(2, kBytes, plan::Tier::kHost, 0)});
  ASSERT_EQ(ex.location(2), Location::kHost);
  ex.set_plan(
      plan_of({prefetch(1, kBytes, plan::Tier::kHost, 1, 2), offload(1, kBytes, plan::Tier::kHost, 3)}));
  ex.set_next_uses(next_uses_of({{1, {2}}, {2, {0}}}, {1, 2}, 4));
  ex.begin_step();
  EXPECT_EQ(ex.position_for_plan(), 2u);
  ex.drain();
  EXPECT_EQ(ex.location(2), Location::kDevice);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.positioned, 1u);
  EXPECT_EQ(stats.positioned_back, 1u);
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_EQ(rig.memory().blocks_reused(), 1);
  EXPECT_TRUE(rig.memory().intact(2));
}

// A tensor used last at the step's end that the plan sends out at its start (its first
// migration, before its first use) is not fetched back: the plan's own prefetch brings it.
TEST(ExecutorPlan, PositioningBackLeavesWhatThePlanSendsOutBeforeItsFirstUse) {
  Rig rig(0);
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  Executor& ex = rig.executor();
  leave_two_away(ex);
  // 1: out at operator 0 (used last at the step's end), back at 1 for its use at 2.
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 0), prefetch(1, kBytes, plan::Tier::kHost, 1, 2)}));
  ex.set_next_uses(next_uses_of({{1, {2}}, {2, {1}}}, {1, 2}, 3));
  ex.begin_step();
  EXPECT_EQ(ex.position_for_plan(), 1u);  // 2 only
  ex.drain();
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  run_ops(ex, 3, {{1, {2}}, {2, {1}}});
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.positioned_back, 1u);
  EXPECT_EQ(stats.demand_fetches, 0u);
  EXPECT_EQ(stats.planned_prefetches, 1u);
}

// A plan that starts each step with a tensor on the device and its copy kept in the tier (its
// last migration a prefetch keeping the copy) sends it out later by dropping it. Positioning's
// fetch back keeps the copy the same way, so that drop copies nothing; but only from the tier the
// plan keeps it in: a copy elsewhere (a reactive eviction's) would otherwise stay there for good.
TEST(ExecutorPlan, PositioningBackKeepsTheCopyThePlanKeepsAtTheStart) {
  for (const plan::Tier away_on : {plan::Tier::kHost, plan::Tier::kSsd}) {
    SCOPED_TRACE(away_on == plan::Tier::kHost ? "away on the plan's tier" : "away on the other tier");
    Rig rig(0);
    rig.add(1, kBytes);
    rig.add(2, kBytes);
    Executor& ex = rig.executor();
    // Tensor 1 away on `away_on`, tensor 2 on the host.
    step_sending_out(ex, {offload(1, kBytes, away_on, 0), offload(2, kBytes, plan::Tier::kHost, 0)});
    const auto kept = [](plan::Migration m) {
      m.kept_copy = true;
      return m;
    };
    // 1: used at 1, dropped at 2 (only read between), back at 3 for the next step's use at 1,
    // its copy kept on the host.
    ex.set_plan(plan_of({kept(offload(1, kBytes, plan::Tier::kHost, 2)),
                         kept(prefetch(1, kBytes, plan::Tier::kHost, 3, 1))}));
    ex.set_next_uses(next_uses_of({{1, {1}}, {2, {3}}}, {1, 2}, 4));
    ex.begin_step();
    EXPECT_EQ(ex.position_for_plan(), 2u);
    ex.drain();
    const bool same_tier = away_on == plan::Tier::kHost;
    EXPECT_EQ(ex.copy_kept(1), same_tier);
    EXPECT_FALSE(ex.copy_kept(2));  // the plan keeps no copy of 2
    run_ops(ex, 3, {{1, {1}}});
    ex.drain();
    const StepStats stats = ex.end_step();
    EXPECT_EQ(stats.positioned_back, 2u);
    EXPECT_EQ(stats.dropped, same_tier ? 1u : 0u);
    EXPECT_EQ(rig.memory().copy_outs(1), same_tier ? 1 : 2);  // the first step's, then a copy to the host
    EXPECT_EQ(ex.location(1), Location::kHost);
    EXPECT_EQ(rig.ssd_used(), 0u);
    const TensorId one[] = {1};
    ex.fetch(std::span<const TensorId>(one));
    EXPECT_TRUE(rig.memory().intact(1));
  }
}

// Only the trace's persistent tensors are positioned: without next uses, none is.
TEST(ExecutorPlan, PositioningWithoutNextUsesSendsNothing) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kHost, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  EXPECT_EQ(ex.position_for_plan(), 0u);
  EXPECT_EQ(ex.end_step().positioned, 0u);
}

TEST(ExecutorPlan, PositioningOutsideAPlannedStepIsRefused) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kHost, 0)}));
  ex.set_next_uses(next_uses_of({{1, {0}}}, {1}, 1));
  ex.set_mode(Mode::kPlanned);
  EXPECT_THROW(ex.position_for_plan(), Error);  // no step begun
  ex.set_mode(Mode::kReactive);
  ex.begin_step();
  EXPECT_THROW(ex.position_for_plan(), Error);
  ex.end_step();
  EXPECT_EQ(ex.location(1), Location::kDevice);
}

TEST(ExecutorPlan, MissingPrefetchIsADemandFetchWithCorrectData) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(7, kBytes);
  ex.set_plan(plan_of({offload(7, kBytes, plan::Tier::kSsd, 1)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const auto start = std::chrono::steady_clock::now();
  ex.before_op(1, {});  // issues the offload
  ex.drain();
  ASSERT_EQ(ex.location(7), Location::kSsd);
  const TensorId used[] = {7};
  ex.before_op(2, used);  // a demand fetch: the tensor's bytes read back from the SSD tier
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ex.location(7), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(7));
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.demand_fetches, 1u);
  ASSERT_EQ(stats.transfers.size(), 2u);
  EXPECT_FALSE(stats.transfers[1].planned);
  EXPECT_EQ(stats.transfers[1].direction, plan::Direction::kPrefetch);

  // before_op times each phase where its work is: the fetch is the resident phase's, not the
  // others', since it waits for a read from a file.
  const auto part = [&](BeforeOpPart p) { return stats.before_op_s[static_cast<std::size_t>(p)]; };
  EXPECT_GT(part(BeforeOpPart::kIssue), 0.0);
  EXPECT_GT(part(BeforeOpPart::kResident), 0.0);
  EXPECT_GT(part(BeforeOpPart::kResident), part(BeforeOpPart::kRoom));
  double sum = 0;
  for (const double s : stats.before_op_s) {
    EXPECT_GE(s, 0.0);
    sum += s;
  }
  EXPECT_LE(sum, wall);
  EXPECT_EQ(to_string(BeforeOpPart::kRoom), "room");
}

TEST(ExecutorPlan, PassiveModeIgnoresThePlan) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kHost, 0)}));
  ex.begin_step();
  ex.before_op(0, {});
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_EQ(ex.end_step().planned_offloads, 0u);
}

TEST(ExecutorPlan, ImpossibleMigrationsAreSkipped) {
  Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  const TensorId used[] = {2};
  // Unknown tensor, prefetch of a resident one, offload of a tensor the operator uses.
  ex.set_plan(
      plan_of({offload(99, kBytes, plan::Tier::kHost, 0), prefetch(1, kBytes, plan::Tier::kHost, 0, 1),
               offload(2, kBytes, plan::Tier::kHost, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(0, used);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.skipped, 3u);
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_EQ(ex.location(2), Location::kDevice);
}

TEST(ExecutorPlan, BudgetHoldsWhenThePlanRunsShortOfMemory) {
  Rig rig(kBytes);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 0), prefetch(1, kBytes, plan::Tier::kHost, 1, 2)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(0, {});
  rig.add(2, kBytes);
  const TensorId produced[] = {2};
  ex.after_op(0, produced);  // waits for the planned offload instead of evicting
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  ex.before_op(1, produced);  // no room for the prefetch while 2 is in use
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_LE(ex.resident_bytes(), kBytes);
  const TensorId used[] = {1};
  ex.before_op(2, used);
  EXPECT_EQ(ex.location(2), Location::kHost);
  EXPECT_TRUE(rig.memory().intact(1));
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.skipped, 1u);
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.demand_fetches, 1u);
  EXPECT_EQ(stats.peak_resident, 2 * kBytes);  // the new output, before after_op could act
  ex.fetch(produced);
  EXPECT_TRUE(rig.memory().intact(2));
}

TEST(ExecutorPlan, OffloadFallsBackToTheOtherTierWhenFull) {
  RigOptions options;
  options.host_capacity = 0;
  Rig rig(0, options);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kHost, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.before_op(0, {});
  ex.drain();
  EXPECT_EQ(ex.location(1), Location::kSsd);
}

// A slow SSD keeps the copy out in flight while the tensor is needed again.
RigOptions slow_ssd() {
  RigOptions options;
  options.host_capacity = 0;
  options.faults.delay = 30ms;
  return options;
}

TEST(ExecutorPlan, UsingATensorWhileItIsOffloadedTakesItBack) {
  Rig rig(0, slow_ssd());
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kSsd, 1)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(1, {});
  ASSERT_EQ(ex.location(1), Location::kOffloading);
  const TensorId used[] = {1};
  ex.before_op(2, used);
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(rig.ssd_used(), 0u);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.cancelled_offloads, 1u);
  EXPECT_EQ(stats.demand_fetches, 0u);
  EXPECT_GT(stats.stall_s, 0.0);
  ASSERT_EQ(stats.stalls.size(), 1u);
  EXPECT_EQ(stats.stalls[0].op, 2u);
}

TEST(ExecutorPlan, PrefetchOfATensorStillBeingOffloadedCancelsTheOffload) {
  Rig rig(0, slow_ssd());
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kSsd, 1), prefetch(1, kBytes, plan::Tier::kSsd, 2, 3)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(1, {});
  ex.before_op(2, {});
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.cancelled_offloads, 1u);
  EXPECT_EQ(stats.planned_prefetches, 0u);
}

// The step before may leave a copy out still running (a slow SSD here) of a tensor the new plan
// keeps on the device: positioning takes it back before operator 0 and fetches nothing, where its
// room check would have finished the copy and the first use fetched the tensor again. (On this
// path the host waits for the copy out to end; on CUDA's device-side path nothing waits.)
TEST(ExecutorPlan, PositioningTakesBackAnOffloadStillUnderWay) {
  Rig rig(0, slow_ssd());
  rig.add(1, kBytes);
  Executor& ex = rig.executor();
  step_sending_out(ex, {offload(1, kBytes, plan::Tier::kSsd, 0)}, false);
  ASSERT_EQ(ex.location(1), Location::kOffloading);  // 30 ms a request: still under way
  ex.set_next_uses(next_uses_of({{1, {1}}}, {1}, 2));
  ex.begin_step();
  EXPECT_EQ(ex.position_for_plan(), 1u);
  EXPECT_EQ(ex.location(1), Location::kDevice);
  run_ops(ex, 2, {{1, {1}}});
  const StepStats stats = ex.end_step();
  ex.drain();
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(stats.positioned_back, 1u);
  EXPECT_EQ(stats.cancelled_offloads, 1u);
  EXPECT_EQ(stats.demand_fetches, 0u);
  EXPECT_EQ(stats.bytes_from_ssd, 0u);
  EXPECT_EQ(rig.ssd_used(), 0u);
}

// A plan whose start is over the budget is not followed there (as for fetches back): the copy
// out goes on, and the tensor is fetched at its use.
TEST(ExecutorPlan, PositioningTakesNothingBackForAPlanThatStartsOverTheBudget) {
  Rig rig(2 * kBytes, slow_ssd());
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  Executor& ex = rig.executor();
  step_sending_out(ex, {offload(1, kBytes, plan::Tier::kSsd, 0)}, false);
  ASSERT_EQ(ex.location(1), Location::kOffloading);
  rig.add(3, kBytes);
  // The plan keeps all three on the device at the start: room for two.
  ex.set_next_uses(next_uses_of({{1, {1}}, {2, {2}}, {3, {3}}}, {1, 2, 3}, 4));
  ex.begin_step();
  EXPECT_EQ(ex.position_for_plan(), 0u);
  EXPECT_NE(ex.location(1), Location::kDevice);
  ex.drain();
  const TensorId one[] = {1};
  ex.fetch(std::span<const TensorId>(one));
  EXPECT_TRUE(rig.memory().intact(1));
}

TEST(ExecutorPlan, TransfersCarryOnIntoTheNextStep) {
  Rig rig(0, slow_ssd());
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kSsd, 1)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  ex.before_op(1, {});
  const StepStats first = ex.end_step();
  EXPECT_EQ(first.planned_offloads, 1u);
  EXPECT_EQ(first.bytes_to_ssd, kBytes);
  ex.begin_step();
  ex.drain();
  const StepStats second = ex.end_step();
  EXPECT_EQ(second.step, first.step + 1);
  EXPECT_EQ(ex.location(1), Location::kSsd);
  ASSERT_EQ(second.transfers.size(), 1u);  // recorded when it was seen complete
  EXPECT_EQ(second.peak_resident, kBytes);
}

TEST(ExecutorPlan, RemovingATensorWithATransferInFlightReleasesItsExtent) {
  Rig rig(0, slow_ssd());
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kSsd, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.before_op(0, {});
  ASSERT_EQ(ex.location(1), Location::kOffloading);
  ex.remove_tensor(1);
  ex.remove_tensor(42);
  EXPECT_FALSE(ex.contains(1));
  EXPECT_EQ(ex.tensor_count(), 1u);
  EXPECT_EQ(ex.resident_bytes(), kBytes);
  EXPECT_EQ(rig.ssd_used(), 0u);
  EXPECT_THROW(ex.location(1), Error);
}

TEST(ExecutorPlan, AddingATrackedTensorTwiceIsRefused) {
  Rig rig(0);
  rig.add(1, kBytes);
  try {
    rig.executor().add_tensor(1, kBytes);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(ExecutorPlan, DestructionWaitsForTransfersAndReleasesExtents) {
  auto copier = io::make_host_copier();
  testing::TempDir dir;
  io::EngineConfig config;
  config.ssd_paths = {dir.path()};
  config.ssd_capacity_per_path = 1 * kMiB;
  config.backend = io::BackendChoice::kPosix;
  io::TierStore store(*copier, config);
  testing::FakeMemory memory;
  memory.add(1, kBytes);
  memory.add(2, kBytes);
  {
    Executor ex(store, memory, {});
    ex.add_tensor(1, kBytes);
    ex.add_tensor(2, kBytes);
    ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kSsd, 0), offload(2, kBytes, plan::Tier::kSsd, 0)}));
    ex.set_mode(Mode::kPlanned);
    ex.before_op(0, {});
  }
  EXPECT_EQ(store.report().paths.at(0).used, 0u);
}

// A tensor the plan moves out for good (the program frees it while away) keeps its extent
// until it is forgotten, which is lazy; an offload that finds the tiers full forgets the
// freed tensors first instead of being skipped.
TEST(ExecutorPlan, AnOffloadFindingTheTiersFullForgetsFreedTensorsFirst) {
  constexpr std::uint64_t kUnit = 64 * kKiB;
  Rig rig(0, RigOptions::one_tensor_per_tier(kUnit));
  Executor& ex = rig.executor();
  for (TensorId id : {1, 2, 3}) rig.add(id, kUnit);
  ex.set_plan(plan_of({offload(1, kUnit, plan::Tier::kHost, 1), offload(2, kUnit, plan::Tier::kHost, 2),
                       offload(3, kUnit, plan::Tier::kHost, 3)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const TensorId all[] = {1, 2, 3};
  ex.before_op(0, all);
  ex.after_op(0, all);
  for (OpIndex k = 1; k <= 3; ++k) {
    ex.before_op(k, {});
    ex.drain();
    if (k == 2) rig.memory().free_silently(1);  // on the host tier: both tiers are now full
    ex.after_op(k, {});
  }
  EXPECT_FALSE(ex.contains(1));
  EXPECT_EQ(ex.location(2), Location::kSsd);  // the host tier was taken by tensor 1
  EXPECT_EQ(ex.location(3), Location::kHost);
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.planned_offloads, 3u);
  EXPECT_EQ(stats.skipped, 0u);
  EXPECT_EQ(ex.resident_bytes(), 0u);
}

}  // namespace
}  // namespace teraio::runtime
