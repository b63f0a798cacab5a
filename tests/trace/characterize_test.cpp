#include "teraio/trace/characterize.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "trace_builders.hpp"

namespace teraio::trace {
namespace {

using testing::add_tensor;
using testing::make_trace;

// One tensor per size bucket except 100MB-1GB, with lifetimes worked out by hand.
Trace study_trace() {
  Trace t = make_trace({0.005, 0.020, 0.001, 0.004});
  add_tensor(t, 500'000, {0}, true);  // idle ops 1..3 across the wrap: 25 ms
  add_tensor(t, 5'000'000, {0, 2});   // idle on op 1: 20 ms
  add_tensor(t, 50'000'000, {1, 2});  // never idle
  add_tensor(t, 2'000'000'000, {3});  // never idle
  return t;
}

TEST(SizeBuckets, PaperBoundaries) {
  EXPECT_EQ(size_buckets().size(), 5u);
  EXPECT_EQ(size_bucket_of(0), 0u);
  EXPECT_EQ(size_bucket_of(999'999), 0u);
  EXPECT_EQ(size_bucket_of(1'000'000), 1u);
  EXPECT_EQ(size_bucket_of(99'999'999), 2u);
  EXPECT_EQ(size_bucket_of(100'000'000), 3u);
  EXPECT_EQ(size_bucket_of(1'000'000'000), 4u);
  EXPECT_EQ(size_bucket_of(~0ull), 4u);
}

TEST(Characterize, HandWorkedTrace) {
  const Characterization c = characterize(study_trace());
  EXPECT_EQ(c.demand_bytes, (std::vector<std::uint64_t>{5'500'000, 55'500'000, 55'500'000, 2'000'500'000}));
  EXPECT_EQ(c.active_bytes, (std::vector<std::uint64_t>{5'500'000, 50'000'000, 55'000'000, 2'000'000'000}));
  ASSERT_EQ(c.sizes.size(), 5u);
  EXPECT_EQ(c.sizes[0].tensors, 1u);
  EXPECT_EQ(c.sizes[3].tensors, 0u);
  EXPECT_EQ(c.sizes[4].bytes, 2'000'000'000u);
  EXPECT_EQ(c.sizes[0].inactive_periods, 1u);
  ASSERT_EQ(c.idle_s_by_bucket[0].size(), 1u);
  EXPECT_DOUBLE_EQ(c.idle_s_by_bucket[0][0], 0.025);
  EXPECT_DOUBLE_EQ(c.idle_s_by_bucket[1][0], 0.020);
  EXPECT_TRUE(c.idle_s_by_bucket[2].empty());

  const CharacterizationSummary& s = c.summary;
  EXPECT_EQ(s.ops, 4u);
  EXPECT_EQ(s.uses, 6u);
  EXPECT_EQ(s.inactive_periods, 2u);
  EXPECT_DOUBLE_EQ(s.step_time_s, 0.030);
  EXPECT_EQ(s.peak_demand_bytes, 2'000'500'000u);
  EXPECT_DOUBLE_EQ(s.max_active_share, 1.0);
  EXPECT_DOUBLE_EQ(s.mean_active_share, (1 + 50 / 55.5 + 55 / 55.5 + 2000 / 2000.5) / 4);
  EXPECT_DOUBLE_EQ(s.share_tensors_idle_over_threshold, 0.5);
  EXPECT_DOUBLE_EQ(s.share_bytes_idle_over_threshold, 5.5e6 / 2055.5e6);
  EXPECT_DOUBLE_EQ(s.share_periods_over_threshold, 1.0);
  // The threshold is strict: a 20 ms period is not longer than 20 ms.
  EXPECT_DOUBLE_EQ(characterize(study_trace(), 0.020).summary.share_tensors_idle_over_threshold, 0.25);
}

TEST(Characterize, EmptyTrace) {
  const Characterization c = characterize(Trace{});
  EXPECT_EQ(c.summary.ops, 0u);
  EXPECT_EQ(c.summary.mean_active_share, 0);
  EXPECT_EQ(c.summary.share_tensors_idle_over_threshold, 0);
}

// Step-local tensors the program held after their last use (a profile with record_releases):
// the bytes per operator from the operator after the last use through the release.
TEST(Characterize, BytesHeldPastTheirLastUse) {
  Trace t = make_trace({0.001, 0.001, 0.001, 0.001, 0.001});
  add_tensor(t, 1000, {0, 1}).held_after_use = 2;  // held at operators 2 and 3
  add_tensor(t, 500, {2}).held_after_use = 1;      // held at operator 3
  add_tensor(t, 7, {0}, true);                     // persistent: never counted
  add_tensor(t, 30, {1});                          // freed at its last use
  const Characterization c = characterize(t);
  EXPECT_EQ(c.held_past_use_bytes, (std::vector<std::uint64_t>{0, 0, 1000, 1500, 0}));
  const CharacterizationSummary& s = c.summary;
  EXPECT_TRUE(s.releases_recorded);
  EXPECT_EQ(s.held_past_use_max_bytes, 1500u);
  EXPECT_EQ(s.held_past_use_max_op, 3u);
  EXPECT_EQ(s.held_past_use_p90_bytes, 1000u);  // the 4th of the 5 sorted: 0 0 0 1000 1500
  // A profile without releases says so, with nothing held.
  const Characterization none = characterize(study_trace());
  EXPECT_FALSE(none.summary.releases_recorded);
  EXPECT_EQ(none.summary.held_past_use_max_bytes, 0u);
  EXPECT_EQ(none.held_past_use_bytes, (std::vector<std::uint64_t>(4, 0)));
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(WriteCharacterization, CsvFilesAndSampledCdf) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("teraio_characterize_" + std::to_string(::getpid()));
  Trace t = make_trace({0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25});
  for (OpIndex k = 1; k < 6; ++k) add_tensor(t, 10, {0, k});  // idle 0..4 ops
  write_characterization(characterize(t), (dir / "out").string(), 2);
  const std::string memory = read(dir / "out" / "memory.csv");
  EXPECT_EQ(memory.rfind(
                "op,start_s,demand_bytes,active_bytes,active_share,held_past_use_bytes\n0,0,50,50,1,0\n", 0),
            0u)
      << memory;
  EXPECT_EQ(std::count(memory.begin(), memory.end(), '\n'), 8);
  // 4 periods of the <1MB bucket (0, 1, 2, 3 and 4 idle ops; the first has none), two sampled.
  EXPECT_EQ(read(dir / "out" / "inactive_cdf.csv"), "bucket,idle_s,cdf\n<1MB,0.25,0.25\n<1MB,1,1\n");
  EXPECT_NE(read(dir / "out" / "sizes.csv").find("<1MB,0,1000000,5,50,4\n"), std::string::npos);
  EXPECT_NE(read(dir / "out" / "summary.json").find("\"inactive_periods\": 4"), std::string::npos);
  EXPECT_NE(read(dir / "out" / "summary.csv").find("tensors,5\n"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace teraio::trace
