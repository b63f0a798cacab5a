// `teraio iobench` (the benchmark of the GPU-facing paths): option parsing rejects bad values
// with clear errors, and a tiny run through the tier store on two directories measures,
// verifies and reports every mode. Uses the host copier, so it runs on any machine.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "iobench_config.hpp"
#include "iobench_raw.hpp"
#include "iobench_report.hpp"
#include "iobench_run.hpp"
#include "support/temp_dir.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/io_backend.hpp"

namespace teraio::cli {
namespace {

namespace fs = std::filesystem;

IobenchConfig parse(const std::vector<std::string>& args) {
  std::string help;
  auto config = parse_iobench_args(args, help);
  if (!config) throw std::runtime_error("unexpected --help");
  return *config;
}

TEST(IobenchOptions, DefaultsMatchTheDocumentedOnes) {
  const IobenchConfig c = parse({});
  EXPECT_TRUE(c.paths.empty());
  EXPECT_EQ(c.volume, kGiB);
  EXPECT_FALSE(c.cuda);
  EXPECT_EQ(c.backends, (std::vector<std::string>{"io_uring", "posix"}));
  EXPECT_EQ(c.repeat, 1u);
  EXPECT_TRUE(c.raw_reference);
}

TEST(IobenchOptions, ParsesEveryOption) {
  const IobenchConfig c = parse({"--paths",
                                 "/a,/b",
                                 "--volume",
                                 "8MiB",
                                 "--threads",
                                 "8",
                                 "--queue-depth=16",
                                 "--stripe-unit",
                                 "1MiB",
                                 "--chunk",
                                 "2MiB",
                                 "--request-size",
                                 "512KiB",
                                 "--transfers",
                                 "2",
                                 "--device",
                                 "CUDA",
                                 "--backends",
                                 "uring",
                                 "--repeat",
                                 "3",
                                 "--no-raw",
                                 "--no-warmup",
                                 "--keep-files",
                                 "--json",
                                 "/tmp/x.json"});
  EXPECT_EQ(c.paths, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(c.volume, 8 * kMiB);
  EXPECT_EQ(c.threads, 8u);
  EXPECT_EQ(c.queue_depth, 16u);
  EXPECT_EQ(c.stripe_unit, kMiB);
  EXPECT_EQ(c.chunk, 2 * kMiB);
  EXPECT_EQ(c.request_size, 512 * kKiB);
  EXPECT_EQ(c.transfers_in_flight, 2u);
  EXPECT_TRUE(c.cuda);
  EXPECT_EQ(c.backends, (std::vector<std::string>{"io_uring"}));
  EXPECT_EQ(c.repeat, 3u);
  EXPECT_FALSE(c.raw_reference);
  EXPECT_FALSE(c.warmup);
  EXPECT_TRUE(c.keep_files);
  EXPECT_EQ(c.json_path, "/tmp/x.json");
}

TEST(IobenchOptions, RejectsBadValuesClearly) {
  const std::vector<std::vector<std::string>> bad = {
      {"--volume", "1000"},      {"--volume", "0"},
      {"--stripe-unit", "5000"}, {"--device", "tpu"},
      {"--backends", "aio"},     {"--threads", "0"},
      {"--queue-depth", "x"},    {"--request-size", "8MiB", "--chunk", "4MiB"},
      {"--unknown-option", "1"}, {"--volume", "lots"},
  };
  for (const auto& args : bad) {
    try {
      parse(args);
      ADD_FAILURE() << "accepted " << args[0] << " " << args[1];
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  }
  std::string help;
  EXPECT_FALSE(parse_iobench_args({"--help"}, help).has_value());
  EXPECT_NE(help.find("--queue-depth"), std::string::npos);
}

TEST(IobenchReport, TableAndJsonCarryEveryRow) {
  BenchReport report;
  report.facts = {{"volume", "8.0 MiB"}, {"quote\"d", "line\nbreak"}};
  report.rows.push_back({"ssd tier", "write", "io_uring", 2, 8 * kMiB, 0.01, 0.5e9, "best raw", "verified"});
  const std::string table = format_table(report);
  EXPECT_NE(table.find("ssd tier"), std::string::npos);
  EXPECT_NE(table.find("168%"), std::string::npos) << table;  // 8 MiB in 10 ms is 0.84 GB/s vs 0.5
  const std::string json = to_json(report);
  EXPECT_NE(json.find("\"quote\\\"d\": \"line\\nbreak\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"backend\": \"io_uring\""), std::string::npos) << json;
}

// Two subdirectories "a" and "b" of one temporary directory: two SSD paths on one disk.
class TempDirs {
 public:
  TempDirs() {
    fs::create_directories(root_.file("a"));
    fs::create_directories(root_.file("b"));
  }
  std::string path(const char* name) const { return root_.file(name); }

 private:
  teraio::testing::TempDir root_{fs::temp_directory_path().string()};
};

TEST(IobenchRun, TinyRunOnTwoDirectoriesMeasuresAndVerifiesEveryMode) {
  TempDirs dirs;
  IobenchConfig c = parse({"--volume", "8MiB", "--chunk", "3MiB", "--request-size", "1MiB", "--stripe-unit",
                           "1MiB", "--threads", "2", "--queue-depth", "4", "--transfers", "2"});
  c.paths = {dirs.path("a"), dirs.path("b")};
  auto copier = io::make_host_copier();
  IobenchRunner runner(c, *copier, c.paths);
  const Reference raw{1e9, 1e9, "test reference"};
  std::vector<io::BackendChoice> backends{io::BackendChoice::kPosix};
  if (io::uring_compiled_in()) backends.push_back(io::BackendChoice::kIoUring);
  for (const auto backend : backends) {
    std::vector<BenchRow> rows;
    try {
      rows = runner.ssd_tier(backend, io::MemoryKind::kHost, raw);
    } catch (const Error& e) {
      // io_uring may be refused by the kernel (seccomp, io_uring_disabled): that is reported, not a failure.
      ASSERT_EQ(backend, io::BackendChoice::kIoUring) << e.what();
      GTEST_LOG_(INFO) << "io_uring unavailable: " << e.what();
      continue;
    }
    ASSERT_EQ(rows.size(), 2u);
    for (const auto& r : rows) {
      EXPECT_EQ(r.bytes, 8 * kMiB);
      EXPECT_EQ(r.paths, 2u);
      EXPECT_GT(r.seconds, 0);
      EXPECT_GT(r.ratio(), 0);
      EXPECT_NE(r.note.find("verified"), std::string::npos) << r.note;
      EXPECT_EQ(r.backend, std::string(io::to_string(backend)));
    }
  }
  // The device rows of the host copier: "device memory" is ordinary memory there.
  const auto bounce = runner.ssd_tier(io::BackendChoice::kPosix, io::MemoryKind::kDevice, raw);
  ASSERT_EQ(bounce.size(), 2u);
  EXPECT_EQ(bounce[1].direction, "ssd->device");
  const auto copies = runner.raw_copy();
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_GT(copies[0].bps(), 0);
  const auto host = runner.host_tier({copies[0].bps(), copies[1].bps(), "raw memcpy"});
  ASSERT_EQ(host.size(), 2u);
  EXPECT_GT(host[0].ratio(), 0);
}

TEST(IobenchRun, RawDdReferenceMeasuresBothDirections) {
  TempDirs dirs;
  RawOptions o{dirs.path("a") + "/raw.dat", 4 * kMiB, kMiB, 4, 1, false};
  const RawMeasurement m = measure_dd(o);
  ASSERT_TRUE(m.problem.empty()) << m.problem;
  EXPECT_GT(m.write_bps, 0);
  EXPECT_GT(m.read_bps, 0);
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 2, 3}), 2.5);
}

}  // namespace
}  // namespace teraio::cli
