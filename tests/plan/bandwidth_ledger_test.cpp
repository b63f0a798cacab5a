// The planner's booking (plan/bandwidth_ledger) with the PCIe link's shared rate: which routes
// hold the link, and what booking one route leaves the others in the same operator.
#include "bandwidth_ledger.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace teraio::plan::detail {
namespace {

constexpr double kGB = 1e9;

// Four 1 s operators; every channel at 1 GB/s, the link shared at `duplex`.
Hardware hardware(double duplex, bool gpudirect = false) {
  Hardware hw;
  hw.d2h_bandwidth = hw.h2d_bandwidth = hw.ssd_write_bandwidth = hw.ssd_read_bandwidth = kGB;
  hw.pcie_duplex_bandwidth = duplex;
  hw.gpudirect = gpudirect;
  return hw;
}

const std::vector<double> kOps(4, 1.0);
constexpr Window kWhole{0, 4};

TEST(BandwidthLedger, AnOffloadTakesTheSharedLinkFromAPrefetchInTheSameOperator) {
  BandwidthLedger ledger(kOps, hardware(1.2 * kGB));
  ledger.book_forward(Route::kOffloadHost, kWhole, 0, 0.8 * kGB);
  // 0.4 GB of the link is left in operator 0 for either prefetch route.
  EXPECT_EQ(ledger.earliest_finish(Route::kPrefetchHost, kWhole, 4, 0.4 * kGB), 0u);
  EXPECT_EQ(ledger.earliest_finish(Route::kPrefetchHost, kWhole, 4, 0.5 * kGB), 1u);
  EXPECT_EQ(ledger.earliest_finish(Route::kPrefetchSsd, kWhole, 4, 0.5 * kGB), 1u);
  EXPECT_DOUBLE_EQ(ledger.rate(Route::kPrefetchHost), kGB);  // above each direction: no route slower
}

TEST(BandwidthLedger, TheSsdBounceHoldsTheLinkAndGpuDirectDoesNot) {
  BandwidthLedger bounced(kOps, hardware(1.2 * kGB));
  bounced.book_forward(Route::kOffloadSsd, kWhole, 0, 0.6 * kGB);
  EXPECT_EQ(bounced.earliest_finish(Route::kPrefetchHost, kWhole, 4, 0.6 * kGB), 0u);
  EXPECT_EQ(bounced.earliest_finish(Route::kPrefetchHost, kWhole, 4, 0.7 * kGB), 1u);

  BandwidthLedger direct(kOps, hardware(1.2 * kGB, /*gpudirect=*/true));
  direct.book_forward(Route::kOffloadSsd, kWhole, 0, kGB);
  EXPECT_EQ(direct.earliest_finish(Route::kPrefetchHost, kWhole, 4, kGB), 0u);
  EXPECT_EQ(direct.earliest_finish(Route::kPrefetchSsd, kWhole, 4, kGB), 0u);
}

TEST(BandwidthLedger, ALinkThatCarriesBothRatesIsNoCap) {
  for (const double duplex : {0.0, 2 * kGB, 3 * kGB}) {
    BandwidthLedger ledger(kOps, hardware(duplex));
    ledger.book_forward(Route::kOffloadHost, kWhole, 0, kGB);
    EXPECT_EQ(ledger.earliest_finish(Route::kPrefetchHost, kWhole, 4, kGB), 0u) << duplex;
  }
  // Just below the sum it caps: 1 GB out leaves 0.9 GB in.
  BandwidthLedger ledger(kOps, hardware(1.9 * kGB));
  ledger.book_forward(Route::kOffloadHost, kWhole, 0, kGB);
  EXPECT_EQ(ledger.earliest_finish(Route::kPrefetchHost, kWhole, 4, kGB), 1u);
}

TEST(BandwidthLedger, ASharedRateBelowOneDirectionsCapsItAlone) {
  const BandwidthLedger ledger(kOps, hardware(0.5 * kGB, /*gpudirect=*/true));
  EXPECT_DOUBLE_EQ(ledger.rate(Route::kOffloadHost), 0.5 * kGB);
  EXPECT_DOUBLE_EQ(ledger.rate(Route::kPrefetchHost), 0.5 * kGB);
  EXPECT_DOUBLE_EQ(ledger.rate(Route::kPrefetchSsd), kGB);  // GPUDirect: not through the link
}

}  // namespace
}  // namespace teraio::plan::detail
