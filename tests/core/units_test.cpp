#include "teraio/core/units.hpp"

#include <gtest/gtest.h>

#include "teraio/core/error.hpp"

namespace teraio {
namespace {

TEST(ParseBytes, AcceptsBinaryAndDecimalUnits) {
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("4k"), 4 * kKiB);
  EXPECT_EQ(parse_bytes("24GiB"), 24 * kGiB);
  EXPECT_EQ(parse_bytes(" 1.5 GiB "), 3 * kGiB / 2);
  EXPECT_EQ(parse_bytes("2GB"), 2'000'000'000u);
  EXPECT_EQ(parse_bytes("3MiB"), 3 * kMiB);
}

TEST(ParseBytes, RejectsMalformedText) {
  for (const char* bad : {"", "GiB", "-1GiB", "1.2.3G", "12 parsecs", "1e", "0.5"}) {
    try {
      parse_bytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
    }
  }
}

TEST(ParseBandwidthAndDuration, UnderstandUnits) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("55GB/s"), 55e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1.4 GB/s"), 1.4e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("800MiB/s"), 800.0 * kMiB);
  EXPECT_DOUBLE_EQ(parse_duration("12ms"), 12e-3);
  EXPECT_DOUBLE_EQ(parse_duration("20us"), 20e-6);
  EXPECT_DOUBLE_EQ(parse_duration("2"), 2.0);
  EXPECT_THROW(parse_duration("2 fortnights"), Error);
}

TEST(Format, PrintsHumanUnits) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(24 * kGiB), "24.0 GiB");
  EXPECT_EQ(format_bandwidth(1.87e9), "1.87 GB/s");
  EXPECT_EQ(format_duration(3.2e-3), "3.20 ms");
}

TEST(Align, RoundsToMultiples) {
  EXPECT_EQ(align_up(1, kPageSize), kPageSize);
  EXPECT_EQ(align_up(kPageSize, kPageSize), kPageSize);
  EXPECT_EQ(align_down(kPageSize + 1, kPageSize), kPageSize);
  EXPECT_TRUE(is_aligned(8 * kPageSize, kPageSize));
}

}  // namespace
}  // namespace teraio
