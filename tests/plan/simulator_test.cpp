#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "sim_test_util.hpp"
#include "teraio/core/error.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/plan/timeline.hpp"

namespace teraio::plan {
namespace {

using simtest::add;
using simtest::kGB;
using simtest::offload;
using simtest::prefetch;
using simtest::unit_hardware;
using simtest::unit_trace;

std::size_t count(const SimulationResult& r, ViolationKind k) {
  return r.violation_counts[static_cast<std::size_t>(k)];
}

TEST(Simulator, WithoutMigrationsTheStepIsIdeal) {
  trace::Trace t = unit_trace(4);
  add(t, kGB, {0, 3});
  add(t, 2 * kGB, {1}, true);
  t.untracked_bytes = kGB / 2;
  const auto r = simulate(t, Plan{}, unit_hardware());
  EXPECT_DOUBLE_EQ(r.step_time_s, 4.0);
  EXPECT_DOUBLE_EQ(r.ideal_step_time_s, 4.0);
  EXPECT_DOUBLE_EQ(r.stall_s, 0.0);
  EXPECT_DOUBLE_EQ(r.share_of_ideal, 1.0);
  EXPECT_EQ(r.peak_memory, 3 * kGB + kGB / 2);
  EXPECT_TRUE(r.ok());
}

// A step-local tensor the program holds past its last use keeps its memory until released.
TEST(Simulator, HeldTensorsKeepTheirMemoryUntilReleased) {
  trace::Trace t = unit_trace(4);
  add(t, kGB, {0});
  t.tensors[0].held_after_use = 2;
  const auto r = simulate(t, Plan{}, unit_hardware());
  EXPECT_EQ(r.memory_at_op, (std::vector<std::uint64_t>{kGB, kGB, kGB, 0}));
  EXPECT_TRUE(r.ok());
}

TEST(Simulator, PrefetchThatCannotFinishStallsByTheMissingTime) {
  trace::Trace t = unit_trace(4);
  const auto a = add(t, kGB, {0, 3}, true);
  Plan p;
  // Offload after op 0 (1 s at 1 GB/s, done when op 2 starts); prefetch issued only before
  // op 3, which needs it: a full second of stall.
  p.migrations = {offload(a, kGB, 1, 2), prefetch(a, kGB, 3, 3)};
  Hardware hw = unit_hardware();
  auto r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.step_time_s, 5.0);
  EXPECT_DOUBLE_EQ(r.stall_s, 1.0);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 1.0);
  ASSERT_EQ(r.top_stalls.size(), 1u);
  EXPECT_EQ(r.top_stalls[0].op, 3u);
  EXPECT_TRUE(r.ok()) << r.describe(t);
  EXPECT_EQ(r.memory_at_op[2], 0u);  // out while op 2 runs
  EXPECT_EQ(r.memory_at_op[3], kGB);
  EXPECT_EQ(r.tier_bytes[0][0], kGB);
  EXPECT_EQ(r.tier_bytes[0][1], kGB);
  EXPECT_EQ(r.channels[0].bytes, kGB);
  EXPECT_DOUBLE_EQ(r.channels[1].busy_s, 1.0);
  EXPECT_DOUBLE_EQ(r.channels[1].utilization, 1.0 / 5.0);

  hw.request_latency_s = 0.25;  // paid once per request
  r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.stall_per_op[2], 0.25);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 1.25);

  p.migrations[1].issue_before = 2;  // in time
  hw.request_latency_s = 0;
  r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.step_time_s, 4.0);
  EXPECT_DOUBLE_EQ(r.stall_s, 0.0);
}

TEST(Simulator, SsdTrafficBouncesThroughPcieWithoutGds) {
  trace::Trace t = unit_trace(4);
  const auto a = add(t, kGB, {0, 3}, true);
  Plan p;
  p.migrations = {offload(a, kGB, 1, 2, Tier::kSsd), prefetch(a, kGB, 3, 3, Tier::kSsd)};
  Hardware hw = unit_hardware();
  hw.d2h_bandwidth = hw.h2d_bandwidth = 0.5e9;  // PCIe slower than the SSD here
  // The bounce runs the SSD leg (1 s) and the PCIe leg (2 s) at the same time: each transfer
  // takes 2 s. Op 2 waits until t=3 (stall 1); the prefetch issued at t=4 ends at 6 (stall 2).
  auto r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.stall_per_op[2], 1.0);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 2.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 7.0);
  for (std::size_t c = 0; c < kChannelCount; ++c) EXPECT_EQ(r.channels[c].bytes, kGB) << c;
  EXPECT_EQ(r.tier_bytes[1][0], kGB);
  EXPECT_EQ(r.ssd_peak, kGB);
  EXPECT_TRUE(r.ok()) << r.describe(t);

  hw.gpudirect = true;  // SSD channels only: 1 s each way
  r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.stall_per_op[2], 0.0);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 1.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 5.0);
  EXPECT_EQ(r.channels[0].bytes, 0u);
  EXPECT_EQ(r.channels[1].bytes, 0u);
}

// With both PCIe directions busy the link gives them pcie_duplex_bandwidth together.
TEST(Simulator, BothPcieDirectionsAtOnceShareTheDuplexCap) {
  trace::Trace t = unit_trace(6);
  const auto a = add(t, kGB, {0, 5});
  const auto b = add(t, kGB, {0, 5});
  Plan p;
  // B leaves alone in op 1; then A leaves (due before op 3) while B comes back, both in op 2.
  p.migrations = {offload(b, kGB, 1, 2), offload(a, kGB, 2, 3), prefetch(b, kGB, 2, 5),
                  prefetch(a, kGB, 4, 5)};
  Hardware hw = unit_hardware();
  auto r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.step_time_s, 6.0) << r.describe(t);
  EXPECT_DOUBLE_EQ(r.stall_s, 0.0);

  hw.pcie_duplex_bandwidth = 1.5e9;  // 0.75 GB/s each way while both run: A's offload takes 4/3 s
  r = simulate(t, p, hw);
  EXPECT_NEAR(r.stall_per_op[3], 1.0 / 3.0, 1e-9) << r.describe(t);
  EXPECT_NEAR(r.step_time_s, 6.0 + 1.0 / 3.0, 1e-9);
  EXPECT_EQ(r.channels[0].bytes, 2 * kGB);  // every byte still moves
  EXPECT_EQ(r.channels[1].bytes, 2 * kGB);
  EXPECT_NEAR(r.channels[0].busy_s, 1.0 + 4.0 / 3.0, 1e-9);  // B alone at full rate, A shared
  EXPECT_TRUE(r.ok()) << r.describe(t);

  hw.pcie_duplex_bandwidth = 2e9;  // no less than both directions' own rates: no effect
  r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.step_time_s, 6.0);
}

// A wait for a transfer while the other direction runs stretched must not commit that other
// transfer to its end: the offload here finishes at 13.33 s and the 10 GB tensor needs no
// fetch of its own (committed to its end, it would cost op 13 two seconds).
TEST(Simulator, WaitingUnderTheDuplexCapDoesNotCommitTheOtherDirection) {
  trace::Trace t = unit_trace(20);
  const auto a = add(t, kGB, {0, 3});
  const auto b = add(t, 10 * kGB, {0, 19});
  add(t, 10 * kGB, {13, 16});
  Plan p;
  p.migrations = {offload(a, kGB, 1, 2), offload(b, 10 * kGB, 3, 18), prefetch(a, kGB, 3, 3),
                  prefetch(b, 10 * kGB, 18, 19)};
  Hardware hw = unit_hardware(12 * kGB);
  hw.pcie_duplex_bandwidth = 1.5e9;
  SimulationOptions options;
  options.enforce_budget = true;
  const auto r = simulate(t, p, hw, options);
  EXPECT_NEAR(r.stall_per_op[13], 0.0, 1e-9) << r.describe(t);
  EXPECT_NEAR(r.step_time_s, 30.0 + 1.0 / 3.0, 1e-9);
}

TEST(Simulator, ASharedPcieRateMustBeAFiniteRate) {
  trace::Trace t = unit_trace(2);
  Hardware hw = unit_hardware();
  hw.pcie_duplex_bandwidth = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(simulate(t, Plan{}, hw), Error);
  hw.pcie_duplex_bandwidth = -1;
  EXPECT_THROW(simulate(t, Plan{}, hw), Error);
  EXPECT_THROW(make_plan(t, hw), Error);
}

TEST(Simulator, ChannelServesUrgentThenEarliestDeadline) {
  trace::Trace t = unit_trace(6);
  const auto b = add(t, kGB, {0, 5});
  const auto c = add(t, kGB, {0, 4});
  Plan p;
  // Listed C first: order on the channel must come from deadlines, not from the list.
  p.migrations = {offload(c, kGB, 1, 3), offload(b, kGB, 1, 2), prefetch(c, kGB, 3, 4),
                  prefetch(b, kGB, 3, 5)};
  auto r = simulate(t, p, unit_hardware());
  EXPECT_DOUBLE_EQ(r.stall_s, 0.0) << r.describe(t);
  EXPECT_DOUBLE_EQ(r.step_time_s, 6.0);
  EXPECT_TRUE(r.ok());

  p.migrations[3].urgent = true;  // B's prefetch jumps ahead of C's earlier deadline
  r = simulate(t, p, unit_hardware());
  EXPECT_DOUBLE_EQ(r.stall_per_op[4], 1.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 7.0);
}

TEST(Simulator, MoreUrgentRequestTakesTheChannelOverAtTheNextOperator) {
  trace::Trace t = unit_trace(8);
  const auto a = add(t, 3 * kGB, {0, 7});
  const auto b = add(t, kGB, {0, 4});
  Plan p;
  // A's 3 s offload starts at t=1; B's, due earlier, is issued at t=2 and takes the channel
  // (done at 3, no stall before op 3); A resumes and finishes at 5: op 4 waits 1 s. Serving
  // A to the end first would have stalled op 3 by 2 s.
  p.migrations = {offload(a, 3 * kGB, 1, 4), offload(b, kGB, 2, 3), prefetch(b, kGB, 3, 4),
                  prefetch(a, 3 * kGB, 4, 7)};
  const auto r = simulate(t, p, unit_hardware());
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 0.0);
  EXPECT_DOUBLE_EQ(r.stall_per_op[4], 1.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 9.0);
  EXPECT_EQ(r.channels[0].bytes, 4 * kGB);
  EXPECT_EQ(r.channels[0].requests, 2u);  // A's two slices are one request
  EXPECT_TRUE(r.ok()) << r.describe(t);
}

TEST(Simulator, MoreBandwidthIsNeverSlowerForAFixedPlan) {
  trace::Trace t = unit_trace(8);
  std::vector<trace::TensorId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(add(t, kGB, {0, static_cast<trace::OpIndex>(4 + i)}));
  Plan p;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    p.migrations.push_back(offload(ids[i], kGB, 1, 2, i % 2 ? Tier::kSsd : Tier::kHost));
    p.migrations.push_back(
        prefetch(ids[i], kGB, 3, static_cast<trace::OpIndex>(4 + i), i % 2 ? Tier::kSsd : Tier::kHost));
  }
  double previous = 1e30;
  for (const double bw : {0.25e9, 0.5e9, 1e9, 2e9, 4e9, 8e9}) {
    Hardware hw = unit_hardware();
    hw.d2h_bandwidth = hw.h2d_bandwidth = hw.ssd_read_bandwidth = hw.ssd_write_bandwidth = bw;
    const auto r = simulate(t, p, hw);
    EXPECT_LE(r.step_time_s, previous + 1e-12) << bw;
    previous = r.step_time_s;
  }
  EXPECT_DOUBLE_EQ(previous, 8.0);
}

TEST(Simulator, ReportsEveryKindOfViolation) {
  trace::Trace t = unit_trace(4);
  const auto a = add(t, kGB, {0, 3});
  const auto late = add(t, kGB, {2, 3});
  // Over budget: nothing moves and the budget is below the demand.
  auto r = simulate(t, Plan{}, unit_hardware(kGB));
  EXPECT_GT(count(r, ViolationKind::kOverBudget), 0u);
  EXPECT_FALSE(r.ok());

  // Not resident: an offload that is never prefetched is fetched on demand, and that costs time.
  Plan p;
  p.migrations = {offload(a, kGB, 1, 2)};
  r = simulate(t, p, unit_hardware());
  EXPECT_EQ(count(r, ViolationKind::kNotResident), 2u);  // once per simulated step
  EXPECT_EQ(r.demand_fetches, 1u);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 1.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 5.0);

  // Host cap: the tier is too small for the offload.
  Hardware small_host = unit_hardware();
  small_host.host_capacity = kGB / 2;
  p.migrations = {offload(a, kGB, 1, 2), prefetch(a, kGB, 2, 3)};
  r = simulate(t, p, small_host);
  EXPECT_GT(count(r, ViolationKind::kHostOverCap), 0u);
  Hardware small_ssd = unit_hardware();
  small_ssd.ssd_capacity = 0;
  p.migrations = {offload(a, kGB, 1, 2, Tier::kSsd), prefetch(a, kGB, 2, 3, Tier::kSsd)};
  r = simulate(t, p, small_ssd);
  EXPECT_GT(count(r, ViolationKind::kSsdOverCap), 0u);

  // Inconsistent: offloading a tensor before it exists.
  p.migrations = {offload(late, kGB, 1, 2)};
  r = simulate(t, p, unit_hardware());
  EXPECT_GT(count(r, ViolationKind::kInconsistent), 0u);
  EXPECT_FALSE(r.violations.empty());

  // A plan naming an unknown tensor or operator is a caller error.
  p.migrations = {offload(999, kGB, 1, 2)};
  EXPECT_THROW(simulate(t, p, unit_hardware()), Error);
  p.migrations = {offload(a, kGB, 1, 9)};
  EXPECT_THROW(simulate(t, p, unit_hardware()), Error);
}

TEST(Simulator, WrapAroundPrefetchIsSteadyStateInTheLastStep) {
  trace::Trace t = unit_trace(4);
  const auto w = add(t, kGB, {0, 1}, true);
  Plan p;
  // Offload after its last use (2 s at 0.5 GB/s), prefetch issued before op 3 for op 0 of the next step.
  p.migrations = {offload(w, kGB, 2, 3), prefetch(w, kGB, 3, 0)};
  Hardware hw = unit_hardware();
  hw.d2h_bandwidth = hw.h2d_bandwidth = 0.5e9;
  SimulationOptions one;
  one.steps = 1;
  // First step: starts resident (its last migration is the prefetch), stalls only at op 3.
  auto r = simulate(t, p, hw, one);
  EXPECT_DOUBLE_EQ(r.stall_per_op[0], 0.0);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 1.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 5.0);
  // Steady state: the prefetch issued at the end of the previous step is late for op 0.
  r = simulate(t, p, hw);
  EXPECT_DOUBLE_EQ(r.stall_per_op[0], 1.0);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 1.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 6.0);
  EXPECT_TRUE(r.ok()) << r.describe(t);
}

TEST(Simulator, PersistentTensorOutAtTheBoundaryStartsOffloaded) {
  trace::Trace t = unit_trace(4);
  const auto w = add(t, kGB, {1}, true);
  Plan p;
  p.migrations = {prefetch(w, kGB, 0, 1), offload(w, kGB, 2, 3)};
  SimulationOptions one;
  one.steps = 1;
  const auto r = simulate(t, p, unit_hardware(kGB), one);
  EXPECT_TRUE(r.ok()) << r.describe(t);
  EXPECT_EQ(r.memory_at_op[0], kGB);  // allocated when the prefetch is issued
  EXPECT_EQ(r.memory_at_op[3], 0u);
  EXPECT_DOUBLE_EQ(r.step_time_s, 4.0);
}

TEST(Simulator, EnforcedBudgetEvictsAndFetchesBackOnDemand) {
  trace::Trace t = unit_trace(4);
  add(t, kGB, {0, 3});
  add(t, kGB, {1, 2});
  SimulationOptions enforce;
  enforce.enforce_budget = true;
  // Op 1 needs room for the second tensor: the first (next used at op 3) is evicted, 1 s, and
  // fetched back before op 3, 1 s.
  const auto r = simulate(t, Plan{}, unit_hardware(kGB), enforce);
  EXPECT_TRUE(r.ok()) << r.describe(t);
  EXPECT_LE(r.peak_memory, kGB);
  EXPECT_EQ(r.evictions, 1u);
  EXPECT_EQ(r.demand_fetches, 1u);
  EXPECT_DOUBLE_EQ(r.stall_per_op[1], 1.0);
  EXPECT_DOUBLE_EQ(r.stall_per_op[3], 1.0);
  EXPECT_DOUBLE_EQ(r.step_time_s, 6.0);
  // Without enforcement the same run only reports the overshoot.
  const auto loose = simulate(t, Plan{}, unit_hardware(kGB));
  EXPECT_DOUBLE_EQ(loose.step_time_s, 4.0);
  EXPECT_GT(count(loose, ViolationKind::kOverBudget), 0u);
}

TEST(StepBound, BandwidthBoundsWhatAnyPlanCanReach) {
  trace::Trace t = unit_trace(4);
  add(t, 2 * kGB, {1}, true);  // persistent, used by op 1 only
  add(t, kGB, {0, 3});         // step-local, idle during ops 1 and 2
  Hardware hw = unit_hardware(10 * kGB);
  auto b = step_time_bound(t, hw);
  EXPECT_DOUBLE_EQ(b.bound_s, 4.0);
  EXPECT_DOUBLE_EQ(b.max_share, 1.0);
  // 1 GB over everywhere. At op 0 only the persistent tensor can be out, and it is needed
  // again right after op 0: bringing 1 GB back stalls 1 s. At op 1 the step-local one must
  // leave between op 0's end and op 1's start: 1 s again.
  hw.gpu_budget = 2 * kGB;
  b = step_time_bound(t, hw);
  EXPECT_DOUBLE_EQ(b.bound_s, 5.0);
  hw.d2h_bandwidth = hw.h2d_bandwidth = 0.25e9;  // 4 s per GB
  b = step_time_bound(t, hw);
  EXPECT_EQ(b.binding_op, 0u);
  // Op 0 alone: 4 s. Op 1's return of the step-local tensor in [2, 3] is apart from op 0's
  // [1, 1]: another 4 s - 1 s (StallsOfTouchingStretchesDoNotAddUp).
  EXPECT_DOUBLE_EQ(b.bound_s, 11.0);
  EXPECT_DOUBLE_EQ(b.max_share, 4.0 / 11.0);
  hw.host_capacity = hw.ssd_capacity = 0;
  EXPECT_EQ(step_time_bound(t, hw).bound_s, std::numeric_limits<double>::infinity());
  // Op 1 alone needs 3 GB: no plan fits 1 GB.
  hw = unit_hardware(kGB);
  b = step_time_bound(t, hw);
  EXPECT_EQ(b.bound_s, std::numeric_limits<double>::infinity());
  EXPECT_EQ(b.binding_op, 1u);
}

// Two micro-batches, each with a peak at its middle operator that only moving its weight W or
// its activation A out and straight back can relieve: every peak stalls on its own.
trace::Trace two_peaks() {
  trace::Trace t = unit_trace(8);
  add(t, kGB, {0, 2, 4, 6}, true);  // W: forward and backward of both micro-batches
  add(t, kGB, {0, 2});              // A1
  add(t, 2 * kGB, {1});             // X1: the first peak
  add(t, kGB, {4, 6});              // A2
  add(t, 2 * kGB, {5});             // X2: the second peak
  return t;
}

TEST(StepBound, StallsOfPeaksInSeparateStretchesAddUp) {
  // At ops 1 and 5, 1 GB of W and A must be off and back by the next operator: 1 s of incoming
  // link each, in [2, 2] and [6, 6], which do not overlap, so 2 s in all.
  const trace::Trace t = two_peaks();
  const StepBound b = step_time_bound(t, unit_hardware(3 * kGB));
  EXPECT_DOUBLE_EQ(b.bound_s, 10.0);
  EXPECT_EQ(b.peaks, 2u);
  EXPECT_EQ(b.binding_op, 1u);
  EXPECT_NE(b.reason.find("add up"), std::string::npos) << b.reason;
  // A budget one peak fits: the other alone binds.
  trace::Trace one = two_peaks();
  one.tensors[4].bytes = kGB;
  const StepBound single = step_time_bound(one, unit_hardware(3 * kGB));
  EXPECT_DOUBLE_EQ(single.bound_s, 9.0);
  EXPECT_EQ(single.peaks, 1u);
  EXPECT_EQ(single.binding_op, 1u);
}

TEST(StepBound, StallsOfTouchingStretchesDoNotAddUp) {
  // P (2 GB, used at op 1) must be half off at op 0 and back by op 1; the op before, op 3 of
  // the step before, wants the same return in [4, 5], which touches op 0's [1, 1] (mod 4): one
  // wait at that moment carries P back for both, so they do not add up to 4 + 3 + 3 s.
  trace::Trace t = unit_trace(4);
  add(t, 2 * kGB, {1}, true);
  add(t, kGB, {0, 3});
  Hardware hw = unit_hardware(2 * kGB);
  hw.d2h_bandwidth = hw.h2d_bandwidth = 0.25e9;
  const StepBound b = step_time_bound(t, hw);
  EXPECT_DOUBLE_EQ(b.bound_s, 11.0);  // 4 s before op 1 and 3 s before op 3
  EXPECT_EQ(b.peaks, 2u);
  SimulationOptions enforce;
  enforce.enforce_budget = true;
  const PlanResult planned = make_plan(t, hw);
  const double step = simulate(t, planned.plan, hw, enforce).step_time_s;
  EXPECT_GE(step + 1e-9, b.bound_s);
  // The same at a tenth of the times: stretches are compared as operator boundaries, so the
  // rounding of 0.1 s sums cannot make the touching ones look apart (it did in seconds: 1.4 s).
  trace::Trace fast = teraio::testing::trace_of_durations(std::vector<double>(4, 0.1));
  add(fast, 2 * kGB, {1}, true);
  add(fast, kGB, {0, 3});
  hw.d2h_bandwidth = hw.h2d_bandwidth = 2.5e9;
  const StepBound tenth = step_time_bound(fast, hw);
  EXPECT_NEAR(tenth.bound_s, 1.1, 1e-9);
  EXPECT_EQ(tenth.peaks, 2u);
}

// A tensor whose first use only reads it: it keeps a valid copy off the device, so leaving
// costs no outgoing link time and only its return can stall (the bound's out stall is 0).
trace::TensorId add_read_then_idle(trace::Trace& t, std::uint64_t bytes, std::vector<trace::OpIndex> uses) {
  const trace::TensorId id = add(t, bytes, uses);
  t.tensors.back().read_only_uses = {uses.front()};
  return id;
}

TEST(StepBound, StallsOfTouchingStretchesInsideTheStepDoNotAddUp) {
  // 4 s per GB; the budget is 2 GB and ops 1 and 2 are 1 GB over it (transients X1, X2).
  // At op 1 only P (idle until op 3) can be out: 4 s to bring it back, 1 s of it hidden by op 2,
  // so 3 s in [2, 3]. At op 2 Q (idle until op 5) is the latest needed: 4 s - 2 s = 2 s in
  // [3, 5]. The stretches share boundary 3, far from the step's end: 8 s + 3 s, not + 3 s + 2 s.
  trace::Trace t = unit_trace(8);
  add_read_then_idle(t, kGB, {0, 3});  // P
  add_read_then_idle(t, kGB, {1, 5});  // Q
  add(t, kGB, {1});                    // X1
  add(t, kGB, {2});                    // X2
  Hardware hw = unit_hardware(2 * kGB);
  hw.d2h_bandwidth = hw.h2d_bandwidth = 0.25e9;
  const StepBound b = step_time_bound(t, hw);
  EXPECT_DOUBLE_EQ(b.bound_s, 11.0);
  EXPECT_EQ(b.peaks, 1u);
  EXPECT_EQ(b.binding_op, 1u);
}

TEST(StepBound, StretchesRunFromTheNextOperatorToTheBindingDeadline) {
  // 5 s per GB; the budget is 3 GB and ops 1, 3 and 5 are 1 GB over it. Each one's only
  // latest-needed tensor (P1, P3, P5) returns 2 operators after it ends: 5 s - 2 s = 3 s each,
  // in [2, 4], [4, 6] and [6, 8]. The middle one touches both others, so the most that adds up
  // is ops 1 and 5: 12 s + 6 s. A stretch one operator shorter at either end would make all
  // three apart: 12 s + 9 s.
  trace::Trace t = unit_trace(12);
  add_read_then_idle(t, kGB, {0, 4});  // P1
  add_read_then_idle(t, kGB, {2, 6});  // P3
  add_read_then_idle(t, kGB, {4, 8});  // P5
  add(t, 3 * kGB, {1});                // with P1: 4 GB
  add(t, 2 * kGB, {3});                // with P1 and P3: 4 GB (op 4 holds 3 GB)
  add(t, 2 * kGB, {5});                // with P3 and P5: 4 GB
  Hardware hw = unit_hardware(3 * kGB);
  hw.d2h_bandwidth = hw.h2d_bandwidth = 0.2e9;
  const StepBound b = step_time_bound(t, hw);
  EXPECT_DOUBLE_EQ(b.bound_s, 18.0);
  EXPECT_EQ(b.peaks, 2u);
  EXPECT_EQ(b.binding_op, 1u);
}

TEST(StepBound, AStretchCrossingTheStepBoundaryAddsUp) {
  // 5 s per GB; the budget is 2 GB and ops 3 and 6 are 1 GB over it. At op 3 P (idle until op
  // 5) returns in [4, 5]: 5 s - 1 s = 4 s. At op 6 only the weight W can be out, and it is next
  // used at op `first` of the next step: 5 s - (first + 1) s in [7, 8 + first], which wraps past
  // the step's end and is apart from [4, 5]. Without the crossing stretch only 4 s would count.
  for (const trace::OpIndex first : {0u, 1u}) {  // the crossing stretch ends at or past the step's end
    trace::Trace t = unit_trace(8);
    add(t, kGB, {first, 3}, true);  // W
    t.tensors.back().read_only_uses = {first, 3};
    add_read_then_idle(t, kGB, {2, 5});  // P
    add(t, kGB, {3});                    // with W and P: 3 GB
    add(t, 2 * kGB, {6});                // with W: 3 GB
    Hardware hw = unit_hardware(2 * kGB);
    hw.d2h_bandwidth = hw.h2d_bandwidth = 0.2e9;
    const StepBound b = step_time_bound(t, hw);
    EXPECT_DOUBLE_EQ(b.bound_s, 8.0 + 4.0 + (4.0 - first)) << first;
    EXPECT_EQ(b.peaks, 2u) << first;
    EXPECT_EQ(b.binding_op, 3u) << first;
  }
}

TEST(StepBound, EveryRunOfOperatorsOverTheBudgetIsExamined) {
  // 1 GB/s; the budget is 4 GB. Ops 1..256 hold R (4 GB, in use) and L (2 GB, idle until op
  // 259): 6 GB, 2 GB over, but L returns in the 2 s before op 259 with no stall. Op 261 holds
  // Y (3 GB, idle until op 262) and a 4 GB transient: 7 GB, and Y's return stalls 3 s in
  // [262, 262]. Ops 264..269 hold Z (1.5 GB, idle until op 270) and transients: 4.5 GB, then
  // 5.5 GB at op 269, whose 1.5 GB of Z stall 1.5 s in [270, 270], apart from [262, 262]. That
  // run is not among the 256 operators most over the budget (257 are over by more), and its
  // worst operator is not among its first 4: 271 s + 3 s + 1.5 s.
  trace::Trace t = unit_trace(271);
  std::vector<trace::OpIndex> region(256);
  for (std::size_t i = 0; i < region.size(); ++i) region[i] = static_cast<trace::OpIndex>(i + 1);
  add(t, 4 * kGB, region);                     // R
  add_read_then_idle(t, 2 * kGB, {0, 259});    // L
  add_read_then_idle(t, 3 * kGB, {260, 262});  // Y
  add(t, 4 * kGB, {261});
  add_read_then_idle(t, 3 * kGB / 2, {263, 270});  // Z
  for (trace::OpIndex k = 264; k < 269; ++k) add(t, 3 * kGB, {k});
  add(t, 4 * kGB, {269});
  const StepBound b = step_time_bound(t, unit_hardware(4 * kGB));
  EXPECT_DOUBLE_EQ(b.bound_s, 275.5);
  EXPECT_EQ(b.peaks, 2u);
  EXPECT_EQ(b.binding_op, 261u);
}

TEST(StepBound, AnOptimizerLessOverTheBudgetThanTheBackwardPassIsExamined) {
  // 1 GB/s; the budget is 4 GB. Ops 1..299 (backward) and 300 (optimizer) use R (4 GB); L
  // (2 GB, read at op 0, idle until op 301) makes ops 1..300 6 GB, all 2 GB over, and only at
  // op 300 is L due right after: 2 s of stall. Op 300 is over by no more than the 299 before
  // it, so it is neither among the 256 most over nor among its run's first 4; it is the
  // optimizer's only peak, and every phase's peaks are examined: 302 s + 2 s.
  trace::Trace t = unit_trace(302);
  for (std::size_t k = 0; k < t.ops.size(); ++k)
    t.ops[k].phase = k < 300 ? trace::Phase::kBackward : trace::Phase::kOptimizer;
  std::vector<trace::OpIndex> region(300);
  for (std::size_t i = 0; i < region.size(); ++i) region[i] = static_cast<trace::OpIndex>(i + 1);
  add(t, 4 * kGB, region);                   // R
  add_read_then_idle(t, 2 * kGB, {0, 301});  // L
  const StepBound b = step_time_bound(t, unit_hardware(4 * kGB));
  EXPECT_DOUBLE_EQ(b.bound_s, 304.0);
  EXPECT_EQ(b.binding_op, 300u);
}

TEST(StepBound, NoSimulatedPlanBeatsIt) {
  // The bound holds against what the simulator makes of the reactive mode (no plan at all).
  trace::Trace t = unit_trace(6);
  add(t, 2 * kGB, {1, 4}, true);
  add(t, kGB, {0, 3});
  add(t, kGB, {2, 5});
  SimulationOptions enforce;
  enforce.enforce_budget = true;
  for (const std::uint64_t budget : {3 * kGB, 4 * kGB}) {
    for (const double bw : {0.25e9, 1e9, 4e9}) {
      Hardware hw = unit_hardware(budget);
      hw.d2h_bandwidth = hw.h2d_bandwidth = bw;
      const auto r = simulate(t, Plan{}, hw, enforce);
      EXPECT_GE(r.step_time_s + 1e-9, step_time_bound(t, hw).bound_s) << budget << " " << bw;
    }
  }
  // Where peaks' stalls add up, against the reactive mode and against the planner's plan.
  const trace::Trace peaks = two_peaks();
  for (const double bw : {0.5e9, 1e9, 2e9, 8e9}) {
    Hardware hw = unit_hardware(3 * kGB);
    hw.d2h_bandwidth = hw.h2d_bandwidth = bw;
    const double bound = step_time_bound(peaks, hw).bound_s;
    EXPECT_GE(simulate(peaks, Plan{}, hw, enforce).step_time_s + 1e-9, bound) << bw;
    const PlanResult planned = make_plan(peaks, hw);
    EXPECT_GE(simulate(peaks, planned.plan, hw, enforce).step_time_s + 1e-9, bound) << bw;
  }
}

TEST(Timeline, IsValidTraceEventJson) {
  trace::Trace t = unit_trace(4);
  const auto a = add(t, kGB, {0, 3}, true);
  t.ops[1].name = "quote\"and\\slash";
  Plan p;
  p.migrations = {offload(a, kGB, 1, 2, Tier::kSsd), prefetch(a, kGB, 3, 3, Tier::kSsd)};
  SimulationOptions opts;
  opts.record_timeline = true;
  const auto r = simulate(t, p, unit_hardware(), opts);
  const auto json = nlohmann::json::parse(timeline_to_json(t, p, r));
  std::size_t ops = 0, transfers = 0, counters = 0;
  for (const auto& e : json.at("traceEvents")) {
    if (e.at("ph") == "X" && e.at("tid") == 1) ++ops;
    if (e.at("ph") == "X" && e.at("tid") != 1) ++transfers;
    if (e.at("ph") == "C") ++counters;
  }
  EXPECT_EQ(ops, 4u);
  EXPECT_EQ(transfers, 4u);  // two legs each way without GDS
  EXPECT_GT(counters, 2u);
}

}  // namespace
}  // namespace teraio::plan
