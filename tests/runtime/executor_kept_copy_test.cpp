// Copies kept in a tier across read-only uses (plan::Migration::kept_copy): a prefetch that
// keeps its copy lets the next offload drop the device memory without copying, a write makes
// the copy stale (the offload copies again), and a full tier takes kept copies back first.
#include <gtest/gtest.h>

#include "runtime_test_support.hpp"

namespace teraio::runtime {
namespace {

using testing::offload;
using testing::plan_of;
using testing::prefetch;
using testing::Rig;
using testing::RigOptions;

constexpr std::uint64_t kBytes = 64 * kKiB;

plan::Migration kept(plan::Migration m) {
  m.kept_copy = true;
  return m;
}

// Tensor 1 used at ops 0, 3 and 6: out after 0, back for 3 keeping its copy, out again after 3
// (a drop when the copy is still valid), back for 6.
plan::Plan two_trips() {
  return plan_of(
      {offload(1, kBytes, plan::Tier::kHost, 1), kept(prefetch(1, kBytes, plan::Tier::kHost, 2, 3)),
       kept(offload(1, kBytes, plan::Tier::kHost, 4)), prefetch(1, kBytes, plan::Tier::kHost, 5, 6)});
}

// Runs ops 0-6 of two_trips(); `between` runs after op 3, where the tensor is back on the device.
template <typename Between>
StepStats run_two_trips(Rig& rig, Between between) {
  Executor& ex = rig.executor();
  ex.set_plan(two_trips());
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const TensorId one[] = {1};
  for (OpIndex k = 0; k <= 6; ++k) {
    const bool uses = k == 0 || k == 3 || k == 6;
    ex.before_op(k, uses ? std::span<const TensorId>(one) : std::span<const TensorId>());
    if (k == 3) between(ex);
    ex.after_op(k, uses ? std::span<const TensorId>(one) : std::span<const TensorId>());
    ex.drain();  // each transfer done before the next migration: no take-backs
  }
  return ex.end_step();
}

TEST(ExecutorKeptCopy, AnUnchangedTensorLeavesAgainWithoutACopy) {
  Rig rig(0);
  rig.add(1, kBytes);
  const StepStats stats = run_two_trips(rig, [](Executor& ex) { EXPECT_TRUE(ex.copy_kept(1)); });
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(rig.memory().copy_outs(1), 1);  // the second trip out copied nothing
  EXPECT_EQ(stats.dropped, 1u);
  EXPECT_EQ(stats.bytes_dropped, kBytes);
  EXPECT_EQ(stats.bytes_to_host, kBytes);
  EXPECT_EQ(stats.bytes_from_host, 2 * kBytes);
  EXPECT_EQ(stats.planned_offloads, 2u);
  EXPECT_EQ(stats.demand_fetches, 0u);
  EXPECT_FALSE(rig.executor().copy_kept(1));
  EXPECT_EQ(rig.host_used(), 0u);  // the kept extent went back with the last fetch
}

TEST(ExecutorKeptCopy, AWriteMakesTheCopyStaleAndTheNextTripCopiesAgain) {
  Rig rig(0);
  rig.add(1, kBytes);
  const StepStats stats = run_two_trips(rig, [&](Executor& ex) {
    const TensorId one[] = {1};
    ex.written(one);
    EXPECT_FALSE(ex.copy_kept(1));
    EXPECT_EQ(rig.host_used(), 0u);  // the stale copy's extent is given back at once
  });
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(rig.memory().copy_outs(1), 2);
  EXPECT_EQ(stats.dropped, 0u);
  EXPECT_EQ(stats.bytes_to_host, 2 * kBytes);
}

TEST(ExecutorKeptCopy, AFullTierTakesKeptCopiesBackBeforeRefusingAnOffload) {
  // One tensor's worth of host tier and of SSD: tensor 1's kept copy fills the host, tensor 2
  // goes to the SSD, and tensor 3 only finds room once the kept copy is given up.
  Rig rig(0, RigOptions::one_tensor_per_tier(kBytes));
  Executor& ex = rig.executor();
  for (TensorId id : {1, 2, 3}) rig.add(id, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 1), kept(prefetch(1, kBytes, plan::Tier::kHost, 2, 3)),
               offload(2, kBytes, plan::Tier::kHost, 4), offload(3, kBytes, plan::Tier::kHost, 4),
               prefetch(2, kBytes, plan::Tier::kHost, 5, 6), prefetch(3, kBytes, plan::Tier::kHost, 5, 6)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const TensorId all[] = {1, 2, 3};
  for (OpIndex k = 0; k <= 6; ++k) {
    const bool uses = k == 0 || k == 3 || k == 6;
    ex.before_op(k, uses ? std::span<const TensorId>(all) : std::span<const TensorId>());
    ex.after_op(k, uses ? std::span<const TensorId>(all) : std::span<const TensorId>());
    ex.drain();
    if (k == 3) {
      EXPECT_TRUE(ex.copy_kept(1));
    }
  }
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.copies_given_up, 1u);
  EXPECT_EQ(stats.skipped, 0u);
  EXPECT_EQ(stats.planned_offloads, 3u);
  EXPECT_FALSE(ex.copy_kept(1));
  for (TensorId id : all) EXPECT_TRUE(rig.memory().intact(id)) << "tensor " << id;
}

}  // namespace
}  // namespace teraio::runtime
