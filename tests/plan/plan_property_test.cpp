// Planner and simulator together: on random traces and on synthetic transformer traces, a
// plan the planner calls feasible never breaks an invariant when simulated, and planning and
// simulating are deterministic.
#include <gtest/gtest.h>

#include "planner_test_util.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/plan/synth.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

std::uint64_t peak(const trace::Trace& t) {
  const auto d = trace::memory_demand(t);
  return *std::max_element(d.begin(), d.end());
}

void expect_equal(const SimulationResult& a, const SimulationResult& b) {
  EXPECT_EQ(a.step_time_s, b.step_time_s);
  EXPECT_EQ(a.stall_per_op, b.stall_per_op);
  EXPECT_EQ(a.memory_at_op, b.memory_at_op);
  EXPECT_EQ(a.violation_counts, b.violation_counts);
}

std::string memory_violations(const SimulationResult& r) {
  std::string out;
  for (const auto& v : r.violations) out += v.message + "\n";
  return out;
}

TEST(PlanProperty, FeasibleRandomPlansHoldEveryInvariantInSimulation) {
  std::size_t feasible = 0;
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    const trace::Trace t = testing::random_trace(seed, 120, 60);
    for (const double share : {0.9, 0.7, 0.5}) {
      Hardware hw = testing::uniform_hardware(static_cast<std::uint64_t>(double(peak(t)) * share), 20e9);
      hw.gpudirect = seed % 2 == 0;
      hw.request_latency_s = seed % 3 == 0 ? 20e-6 : 0.0;
      const PlanResult planned = make_plan(t, hw);
      const SimulationResult r = simulate(t, planned.plan, hw);
      if (!planned.plan.feasible) continue;
      ++feasible;
      EXPECT_TRUE(r.ok()) << "seed " << seed << " share " << share << "\n"
                          << r.describe(t) << memory_violations(r);
      EXPECT_LE(r.peak_memory, hw.gpu_budget) << "seed " << seed << " share " << share;
      // The planner booked the bandwidth its transfers need, so they arrive (almost) in time.
      EXPECT_GT(r.share_of_ideal, 0.95) << "seed " << seed << " share " << share << "\n" << r.describe(t);
      expect_equal(r, simulate(t, make_plan(t, hw).plan, hw));
    }
  }
  EXPECT_GT(feasible, 20u);  // the property was exercised
}

TEST(PlanProperty, SyntheticTransformerPlansHoldInSimulation) {
  ModelConfig m;
  m.layers = 4;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 4;
  m.ffn = 1408;
  m.vocab = 8000;
  m.micro_batch = 4;
  m.seq_len = 512;
  m.micro_batches = 2;
  const trace::Trace t = synthesize(m, gpu_preset("h100"));
  Hardware hw;
  hw.host_capacity = 64 * kGiB;
  hw.ssd_capacity = 1024 * kGiB;
  // Bandwidths scaled up with this small model's short step (7 ms), so that plans exist.
  hw.d2h_bandwidth = hw.h2d_bandwidth = 200e9;
  hw.ssd_write_bandwidth = hw.ssd_read_bandwidth = 50e9;
  std::size_t feasible = 0;
  for (const double share : {0.95, 0.9, 0.85}) {
    hw.gpu_budget = static_cast<std::uint64_t>(double(peak(t)) * share);
    const PlanResult planned = make_plan(t, hw);
    const SimulationResult r = simulate(t, planned.plan, hw);
    if (!planned.plan.feasible) continue;
    ++feasible;
    EXPECT_TRUE(r.ok()) << "share " << share << "\n" << r.describe(t) << memory_violations(r);
    EXPECT_GT(r.share_of_ideal, 0.95) << "share " << share << "\n" << r.describe(t);
    expect_equal(r, simulate(t, planned.plan, hw));
  }
  EXPECT_GT(feasible, 0u);
}

}  // namespace
}  // namespace teraio::plan
