// Round trips through the tier store: every backend, host and "device" memory (the host
// copier runs the bounce path as CUDA would), aligned and unaligned buffers, odd sizes,
// striping, many transfers in flight, checksums.
#include "teraio/io/tier_store.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "io_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/timer_slack.hpp"

namespace teraio::io {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::TempDir;

constexpr std::uint64_t kStripe = 64 * kKiB;

void wait_or_fail(const Transfer& transfer) {
  ASSERT_TRUE(transfer.wait_for(30s)) << "transfer hung";
  transfer.wait();
}

EngineConfig small_config(const std::vector<std::string>& paths, BackendChoice backend) {
  EngineConfig config;
  config.host_capacity = 8 * kMiB;
  config.ssd_paths = paths;
  config.ssd_capacity_per_path = 16 * kMiB;
  config.stripe_unit = kStripe;
  config.chunk_bytes = 16 * kKiB;
  config.bounce_pool_bytes = 128 * kKiB;
  config.backend = backend;
  config.io_threads = 2;
  config.queue_depth = 4;
  config.transfer_threads = 3;
  config.chunks_in_flight = 4;
  return config;
}

std::vector<BackendChoice> backends() {
  std::vector<BackendChoice> out{BackendChoice::kPosix};
  if (uring_compiled_in()) out.push_back(BackendChoice::kIoUring);
  return out;
}

// Device buffer from the copier, host buffer offset by `misalign` bytes from a page boundary.
struct Buffer {
  Buffer(DeviceCopier& copier, MemoryKind kind, std::size_t n, std::size_t misalign)
      : copier_(copier), kind_(kind) {
    if (kind == MemoryKind::kDevice) {
      base_ = static_cast<std::byte*>(copier.allocate_device(n + 1));
      data = base_;
    } else {
      host_.resize(n + misalign + 2 * kPageSize);
      auto at = align_up(reinterpret_cast<std::uintptr_t>(host_.data()), kPageSize) + misalign;
      data = reinterpret_cast<std::byte*>(at);
    }
  }
  ~Buffer() {
    if (base_ != nullptr) copier_.free_device(base_);
  }
  DeviceCopier& copier_;
  MemoryKind kind_;
  std::byte* base_ = nullptr;
  std::vector<std::byte> host_;
  std::byte* data = nullptr;
};

class TierStoreRoundTrip
    : public ::testing::TestWithParam<std::tuple<BackendChoice, MemoryKind, std::size_t, bool>> {};

TEST_P(TierStoreRoundTrip, EveryByteComesBack) {
  const auto [backend, kind, misalign, checksums] = GetParam();
  TempDir a, b;
  auto copier = make_host_copier();
  EngineConfig config = small_config({a.path(), b.path()}, backend);
  config.checksums = checksums;
  TierStore store(*copier, config);
  const std::vector<std::uint64_t> sizes{0,     1,           199,           4095,        4096,
                                         4097,  kStripe - 1, kStripe,       kStripe + 1, 3 * kStripe + 5,
                                         12345, 16 * kKiB,   16 * kKiB + 1, 1 * kMiB + 3};
  std::uint32_t seed = 1;
  for (TierKind tier : {TierKind::kHost, TierKind::kSsd}) {
    for (std::uint64_t n : sizes) {
      SCOPED_TRACE(::testing::Message() << to_string(tier) << " " << n << " bytes");
      const auto expected = pattern(n, seed++);
      Buffer src(*copier, kind, n, misalign);
      Buffer dst(*copier, kind, n, misalign);
      if (n > 0) std::memcpy(src.data, expected.data(), n);
      if (n > 0) std::memset(dst.data, 0xee, n);
      auto extent = store.allocate(tier, n);
      ASSERT_TRUE(extent);
      wait_or_fail(store.write(*extent, src.data, kind, "tensor-" + std::to_string(n)));
      wait_or_fail(store.read(*extent, dst.data, kind));
      ASSERT_TRUE(n == 0 || std::memcmp(dst.data, expected.data(), n) == 0) << "wrong bytes";
      store.release(*extent);
    }
  }
  const TierStoreReport report = store.report();
  EXPECT_EQ(report.host_used, 0u);
  ASSERT_EQ(report.paths.size(), 2u);
  for (const PathReport& path : report.paths) {
    EXPECT_EQ(path.used, 0u);
    EXPECT_EQ(path.backend, backend == BackendChoice::kPosix ? "posix" : "io_uring");
    EXPECT_TRUE(path.direct_io);  // /tmp is ext4 here; a tmpfs without O_DIRECT is tested elsewhere
    EXPECT_GT(path.bytes_written, 0u) << "striping must use every path";
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, TierStoreRoundTrip,
                         ::testing::Combine(::testing::ValuesIn(backends()),
                                            ::testing::Values(MemoryKind::kHost, MemoryKind::kDevice),
                                            ::testing::Values(std::size_t{0}, std::size_t{3}),
                                            ::testing::Bool()));

TEST(TierStore, StripesLargeExtentsOverAllPathsAndSmallOnesWhole) {
  TempDir a, b, c;
  auto copier = make_host_copier();
  TierStore store(*copier, small_config({a.path(), b.path(), c.path()}, BackendChoice::kAuto));
  auto big = store.allocate(TierKind::kSsd, 6 * kStripe + 100);
  auto small = store.allocate(TierKind::kSsd, kStripe);
  ASSERT_TRUE(big && small);
  std::set<std::string> big_paths;
  for (const auto& piece : store.placement(*big)) big_paths.insert(piece.path);
  EXPECT_EQ(big_paths.size(), 3u);
  EXPECT_EQ(store.placement(*small).size(), 1u);
}

// The names of this process's TeraIO threads, as a profiler shows them (/proc/self/task/*/comm).
std::multiset<std::string> teraio_thread_names() {
  std::multiset<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.starts_with("teraio-")) names.insert(name);
  }
  return names;
}

TEST(TierStore, ItsThreadsAreNamed) {
#if defined(__linux__)
  TempDir a;
  auto copier = make_host_copier();
  TierStore store(*copier, small_config({a.path()}, BackendChoice::kPosix));
  // transfer_threads 3, a watcher per direction, io_threads 2.
  const std::multiset<std::string> expected = {"teraio-transfer", "teraio-transfer", "teraio-transfer",
                                               "teraio-wait-d2h", "teraio-wait-h2d", "teraio-posix-io",
                                               "teraio-posix-io"};
  // Each thread names itself when it starts: give them a moment.
  std::multiset<std::string> names = teraio_thread_names();
  for (int i = 0; i < 400 && names != expected; ++i) {
    std::this_thread::sleep_for(5ms);
    names = teraio_thread_names();
  }
  EXPECT_EQ(names, expected);
#else
  GTEST_SKIP() << "thread names are read from /proc";
#endif
}

TEST(TierStore, ManyTransfersInFlight) {
  TempDir a, b;
  auto copier = make_host_copier();
  TierStore store(*copier, small_config({a.path(), b.path()}, BackendChoice::kAuto));
  constexpr int kCount = 48;
  std::vector<Extent> extents;
  std::vector<std::vector<std::byte>> data, back(kCount);
  std::vector<Transfer> transfers;
  for (int i = 0; i < kCount; ++i) {
    const std::uint64_t n = 1000 + static_cast<std::uint64_t>(i) * 7919;
    data.push_back(pattern(n, 100 + i));
    back[i].assign(n, std::byte{0});
    extents.push_back(*store.allocate(i % 3 == 0 ? TierKind::kHost : TierKind::kSsd, n));
    transfers.push_back(store.write(extents.back(), data.back().data(), MemoryKind::kHost));
  }
  for (auto& t : transfers) wait_or_fail(t);
  transfers.clear();
  for (int i = 0; i < kCount; ++i)
    transfers.push_back(store.read(extents[i], back[i].data(), MemoryKind::kDevice));
  for (int i = 0; i < kCount; ++i) {
    wait_or_fail(transfers[i]);
    EXPECT_EQ(back[i], data[i]) << "extent " << i;
  }
}

TEST(TierStore, SwapFileIsReusedNotRecreated) {
  TempDir a;
  auto copier = make_host_copier();
  std::string swap_path;
  {
    TierStore store(*copier, small_config({a.path()}, BackendChoice::kPosix));
    swap_path = store.report().paths.at(0).path;
  }
  ASSERT_TRUE(std::filesystem::exists(swap_path));
  const auto inode = std::filesystem::status(swap_path).type();
  TierStore again(*copier, small_config({a.path()}, BackendChoice::kPosix));
  EXPECT_EQ(again.report().paths.at(0).path, swap_path);
  EXPECT_EQ(std::filesystem::status(swap_path).type(), inode);
  EXPECT_EQ(std::filesystem::file_size(swap_path), 16 * kMiB);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(a.path())) ++files;
  EXPECT_EQ(files, 1u) << "one swap file per path, never one per tensor";
}

TEST(TierStore, RankIsSubstitutedInPaths) {
  TempDir a;
  std::filesystem::create_directory(a.path() + "/r3");
  auto copier = make_host_copier();
  EngineConfig config = small_config({a.path() + "/r{rank}"}, BackendChoice::kPosix);
  config.rank = 3;
  TierStore store(*copier, config);
  EXPECT_EQ(store.report().paths.at(0).path, a.path() + "/r3/teraio-rank3.swap");
}

TEST(TierStore, ReportNamesBackendAndCuFileState) {
  TempDir a;
  auto copier = make_host_copier();
  TierStore store(*copier, small_config({a.path()}, BackendChoice::kAuto));
  const TierStoreReport report = store.report();
  EXPECT_EQ(report.copier, "host");
  EXPECT_EQ(report.paths.at(0).backend, uring_compiled_in() ? "io_uring" : "posix");
  EXPECT_FALSE(report.paths.at(0).cufile_active);
  EXPECT_FALSE(report.paths.at(0).cufile_detail.empty());
  const std::string text = format_report(report);
  EXPECT_NE(text.find(report.paths.at(0).path), std::string::npos);
  EXPECT_NE(text.find("O_DIRECT"), std::string::npos);
}

// The watchers poll a copier whose copies complete out of order (CUDA's, in deadline order) every
// 20 us; with the kernel's default timer slack each pause lasts much longer (core/timer_slack).
TEST(TierStore, WatchersPollWithTheTimerSlackTheyReadBack) {
  auto copier = make_host_copier();
  TierStore store(*copier, small_config({}, BackendChoice::kAuto));
  for (int attempt = 0; attempt < 200 && store.watcher_slack().started() < 2; ++attempt) {
    std::this_thread::sleep_for(5ms);  // the watchers record their slack as they start
  }
  ASSERT_EQ(store.watcher_slack().started(), 2);
  if (!timer_slack()) GTEST_SKIP() << "this platform does not say a thread's timer slack";
  const auto expected =
      polling_timer_slack() ? *polling_timer_slack() : *timer_slack();  // "kernel": inherited
  EXPECT_EQ(store.watcher_slack().common(), expected);
  const std::string line = format_report(store.report());
  EXPECT_EQ(line.find("watchers poll"), std::string::npos) << "the host copier completes in order: " << line;
}

TEST(TierStore, UringRegistersTheBouncePool) {
  if (!uring_compiled_in()) GTEST_SKIP() << "no io_uring in this build";
  TempDir a;
  auto copier = make_host_copier();
  TierStore store(*copier, small_config({a.path()}, BackendChoice::kIoUring));
  // Registration can be refused (RLIMIT_MEMLOCK); either way it is reported, and data flows.
  const bool registered = store.report().paths.at(0).buffers_registered;
  auto extent = *store.allocate(TierKind::kSsd, 100000);
  const auto data = pattern(100000, 9);
  std::vector<std::byte> back(100000);
  wait_or_fail(store.write(extent, data.data(), MemoryKind::kDevice));
  wait_or_fail(store.read(extent, back.data(), MemoryKind::kDevice));
  EXPECT_EQ(back, data) << "registered=" << registered;
}

}  // namespace
}  // namespace teraio::io
