#include <gtest/gtest.h>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/sweep.hpp"
#include "teraio/plan/synth.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

trace::Trace small_transformer() {
  ModelConfig m;
  m.layers = 4;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 8;
  m.ffn = 1408;
  m.vocab = 8000;
  m.micro_batch = 4;
  m.seq_len = 512;
  return synthesize(m, gpu_preset("h100"));
}

TEST(Sweep, HardwareFollowsTheMode) {
  Hardware base;
  base.host_capacity = 10 * kGiB;
  const Hardware ssd = sweep_hardware(base, 32e9, SweepMode::kSsd);
  EXPECT_TRUE(ssd.gpudirect);
  EXPECT_EQ(ssd.host_capacity, 0u);
  EXPECT_GT(ssd.ssd_capacity, 0u);
  EXPECT_EQ(ssd.ssd_read_bandwidth, 32e9);
  EXPECT_EQ(ssd.d2h_bandwidth, base.d2h_bandwidth);
  const Hardware all = sweep_hardware(base, 16e9, SweepMode::kAllChannels);
  EXPECT_EQ(all.d2h_bandwidth, 16e9);
  EXPECT_EQ(all.ssd_write_bandwidth, 16e9);
  EXPECT_EQ(all.host_capacity, base.host_capacity);
  EXPECT_THROW(sweep_hardware(base, 0, SweepMode::kSsd), Error);
  // A shared PCIe cap keeps its share of both directions' rates (94 of 2 x 55 GB/s): at 16 GB/s
  // each way, 32 x 94 / 110.
  base.pcie_duplex_bandwidth = 94e9;
  EXPECT_DOUBLE_EQ(sweep_hardware(base, 16e9, SweepMode::kAllChannels).pcie_duplex_bandwidth,
                   32e9 * 94.0 / 110.0);
  EXPECT_EQ(sweep_hardware(base, 32e9, SweepMode::kSsd).pcie_duplex_bandwidth, 94e9);
  EXPECT_THROW(parse_sweep_mode("pcie"), Error);
}

TEST(Sweep, MoreBandwidthGivesAtLeastAsMuchPerformance) {
  const trace::Trace t = small_transformer();
  const auto demand = trace::memory_demand(t);
  const std::uint64_t peak = *std::max_element(demand.begin(), demand.end());
  SweepOptions o;
  o.bandwidths = {1e9, 4e9, 16e9, 64e9, 256e9, 1024e9};
  o.budgets = {peak * 9 / 10};
  const auto points = sweep(t, o);
  ASSERT_EQ(points.size(), o.bandwidths.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    EXPECT_GT(points[i].normalized, 0.0);
    EXPECT_LE(points[i].normalized, 1.0 + 1e-12);
    // Planning differs per point, so allow a little noise, never a real loss.
    if (i > 0) {
      EXPECT_GE(points[i].normalized, points[i - 1].normalized - 0.02) << i;
    }
  }
  // Enough bandwidth hides every migration; too little shows as budget-keeping stalls.
  EXPECT_TRUE(points.back().feasible);
  EXPECT_GT(points.back().normalized, 0.95);
  EXPECT_LT(points.front().normalized, 0.5);
  const std::string csv = sweep_to_csv(points);
  EXPECT_EQ(split(csv, '\n').size(), points.size() + 2);  // header, points, trailing empty
}

}  // namespace
}  // namespace teraio::plan
