// Bad input and faults: each must surface as a teraio::Error naming its context, never as a
// hang, a crash or a silently wrong byte.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/io/swap_file.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::io {
namespace {

using namespace std::chrono_literals;
using testing::FaultyBackend;
using testing::pattern;
using testing::TempDir;

EngineConfig config_for(const std::vector<std::string>& paths) {
  EngineConfig config;
  config.host_capacity = 1 * kMiB;
  config.ssd_paths = paths;
  config.ssd_capacity_per_path = 8 * kMiB;
  config.stripe_unit = 64 * kKiB;
  config.chunk_bytes = 16 * kKiB;
  config.bounce_pool_bytes = 64 * kKiB;
  config.io_threads = 2;
  config.queue_depth = 4;
  config.transfer_threads = 2;
  config.chunks_in_flight = 4;
  return config;
}

void with_faults(EngineConfig& config, FaultyBackend::Faults faults, FaultyBackend** out = nullptr) {
  config.wrap_backend = [faults, out](std::unique_ptr<IoBackend> real, const std::string&) {
    auto faulty = std::make_unique<FaultyBackend>(std::move(real), faults);
    if (out != nullptr) *out = faulty.get();
    return std::unique_ptr<IoBackend>(std::move(faulty));
  };
}

// Runs f, expecting an Error of the given kind whose message contains every needle.
template <typename F>
Error expect_error(F&& f, ErrorKind kind, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return e;
  }
  ADD_FAILURE() << "no error thrown";
  return Error(ErrorKind::kInternal, "none");
}

std::vector<BackendChoice> backends() {
  std::vector<BackendChoice> out{BackendChoice::kPosix};
  if (uring_compiled_in()) out.push_back(BackendChoice::kIoUring);
  return out;
}

void wait_bounded(const Transfer& t) {
  ASSERT_TRUE(t.wait_for(30s)) << "transfer hung";
}

TEST(TierFaults, MissingPathIsNamed) {
  auto copier = make_host_copier();
  const std::string missing = "/tmp/teraio-no-such-dir-" + std::to_string(getpid());
  const Error e =
      expect_error([&] { TierStore store(*copier, config_for({missing})); }, ErrorKind::kIo, {missing});
  EXPECT_EQ(e.sys_errno(), ENOENT);
}

TEST(TierFaults, PathThatIsAFileIsRejected) {
  TempDir dir;
  const std::string file = dir.path() + "/plain";
  { std::ofstream(file) << "x"; }
  auto copier = make_host_copier();
  expect_error([&] { TierStore store(*copier, config_for({file})); }, ErrorKind::kInvalidArgument, {file});
}

TEST(TierFaults, UnwritablePathIsNamed) {
  auto copier = make_host_copier();
  TempDir dir;
  std::string target = dir.path() + "/readonly";
  std::filesystem::create_directory(target);
  if (geteuid() == 0) {
    // root ignores permission bits: /proc refuses new files for everyone.
    target = "/proc/self";
  } else {
    std::filesystem::permissions(target,
                                 std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  }
  try {
    TierStore store(*copier, config_for({target}));
    ADD_FAILURE() << "opened a swap file under " << target;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
  }
}

TEST(TierFaults, PreallocationLargerThanTheDiskIsNoSpaceNamingPathAndBytes) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = config_for({dir.path()});
  config.ssd_capacity_per_path = 1024 * kTiB;  // 1 PiB
  const Error e = expect_error([&] { TierStore store(*copier, config); }, ErrorKind::kNoSpace,
                               {dir.path(), std::to_string(1024 * kTiB)});
  EXPECT_EQ(e.sys_errno(), ENOSPC);
}

TEST(TierFaults, BufferedFallbackIsReportedAndExact) {
  // On kernels whose tmpfs refuses O_DIRECT, /dev/shm takes the EINVAL fallback; elsewhere the
  // configuration switch takes the same buffered path.
  const bool have_shm = std::filesystem::is_directory("/dev/shm");
  TempDir dir(have_shm ? "/dev/shm" : "/tmp");
  for (bool direct : {true, false}) {
    auto copier = make_host_copier();
    EngineConfig config = config_for({dir.path()});
    config.direct_io = direct;
    TierStore store(*copier, config);
    const PathReport path = store.report().paths.at(0);
    if (!direct) {
      EXPECT_FALSE(path.direct_io);
      EXPECT_EQ(path.buffered_reason, "O_DIRECT disabled by configuration");
    }
    EXPECT_EQ(path.direct_io, path.buffered_reason.empty()) << path.buffered_reason;
    EXPECT_NE(format_report(store.report()).find(path.direct_io ? "O_DIRECT" : "buffered"),
              std::string::npos);
    for (std::uint64_t n : {1ull, 199ull, 4095ull, 4097ull, 70000ull}) {
      const auto data = pattern(n, static_cast<std::uint32_t>(n));
      std::vector<std::byte> back(n);
      auto extent = *store.allocate(TierKind::kSsd, n);
      store.write(extent, data.data() + 0, MemoryKind::kHost).wait();
      store.read(extent, back.data(), MemoryKind::kDevice).wait();
      EXPECT_EQ(back, data) << n << " bytes, direct=" << path.direct_io;
      store.release(extent);
    }
  }
}

// A filesystem that refuses O_DIRECT the way older tmpfs does: open(2) fails with EINVAL.
int open_without_direct_io(const char* path, int flags, unsigned mode) {
  if ((flags & O_DIRECT) != 0) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags, static_cast<mode_t>(mode));
}

TEST(TierFaults, FilesystemRefusingDirectIoFallsBackToBufferedAndSaysSo) {
  TempDir dir;
  SwapFile file(dir.path(), 0, kMiB, false, true, open_without_direct_io);
  EXPECT_FALSE(file.direct_io());
  EXPECT_NE(file.buffered_reason().find("EINVAL"), std::string::npos) << file.buffered_reason();
  const std::string text = "buffered bytes";
  ASSERT_EQ(::pwrite(file.fd(), text.data(), text.size(), 4096), static_cast<ssize_t>(text.size()));
  std::string back(text.size(), '\0');
  ASSERT_EQ(::pread(file.fd(), back.data(), back.size(), 4096), static_cast<ssize_t>(back.size()));
  EXPECT_EQ(back, text);
}

TEST(TierFaults, IoErrorDuringTransferNamesPathAndOffsetAndTheStoreStaysUsable) {
  for (auto [backend, k] : {std::pair{BackendChoice::kPosix, 1ull},
                            {BackendChoice::kPosix, 7ull},
                            {BackendChoice::kAuto, 1ull},
                            {BackendChoice::kAuto, 3ull},
                            {BackendChoice::kAuto, 7ull}}) {
    TempDir dir;
    auto copier = make_host_copier();
    EngineConfig config = config_for({dir.path()});
    config.backend = backend;
    with_faults(config, {.fail_at = k});
    TierStore store(*copier, config);
    const auto data = pattern(200000, 5);
    auto extent = *store.allocate(TierKind::kSsd, data.size());
    const Transfer failed = store.write(extent, data.data(), MemoryKind::kDevice, "layer3.weight");
    wait_bounded(failed);
    const Error e = expect_error([&] { failed.wait(); }, ErrorKind::kIo,
                                 {store.report().paths.at(0).path, "offset", "write"});
    EXPECT_EQ(e.sys_errno(), EIO);
    std::vector<std::byte> back(data.size());
    expect_error([&] { store.read(extent, back.data(), MemoryKind::kHost).wait(); }, ErrorKind::kIo,
                 {"layer3.weight", "last write failed"});
    // Later transfers (past the k-th request) work: a failure is local to its transfer.
    store.write(extent, data.data(), MemoryKind::kDevice).wait();
    store.read(extent, back.data(), MemoryKind::kDevice).wait();
    EXPECT_EQ(back, data);
  }
}

TEST(TierFaults, ReadErrorIsReported) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = config_for({dir.path()});
  with_faults(config, {.fail_at = 20});  // the write takes 13 requests (200000 B / 16 KiB)
  TierStore store(*copier, config);
  const auto data = pattern(200000, 6);
  std::vector<std::byte> back(data.size());
  auto extent = *store.allocate(TierKind::kSsd, data.size());
  store.write(extent, data.data(), MemoryKind::kHost).wait();
  const Transfer t = store.read(extent, back.data(), MemoryKind::kDevice);
  wait_bounded(t);
  expect_error([&] { t.wait(); }, ErrorKind::kIo, {"read", store.report().paths.at(0).path});
}

TEST(TierFaults, ShortTransfersAreResumed) {
  for (BackendChoice backend : backends()) {
    for (bool direct : {true, false}) {
      TempDir dir;
      auto copier = make_host_copier();
      EngineConfig config = config_for({dir.path()});
      config.backend = backend;
      config.direct_io = direct;
      FaultyBackend* faulty = nullptr;
      with_faults(config, {.short_transfers = true}, &faulty);
      TierStore store(*copier, config);
      for (std::uint64_t n : {1ull, 4097ull, 100001ull}) {
        const auto data = pattern(n, 11);
        std::vector<std::byte> back(n);
        auto extent = *store.allocate(TierKind::kSsd, n);
        store.write(extent, data.data(), MemoryKind::kDevice).wait();
        store.read(extent, back.data(), MemoryKind::kHost).wait();
        EXPECT_EQ(back, data) << n << " direct=" << direct << " " << to_string(backend);
        store.release(extent);
      }
      ASSERT_NE(faulty, nullptr);
      EXPECT_GT(faulty->shortened(), 0u);
    }
  }
}

TEST(TierFaults, EndOfFileOnReadFailsInsteadOfHanging) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = config_for({dir.path()});
  with_faults(config, {.zero_reads = true});
  TierStore store(*copier, config);
  std::vector<std::byte> back(5000);
  auto extent = *store.allocate(TierKind::kSsd, back.size());
  const Transfer t = store.read(extent, back.data(), MemoryKind::kHost);
  wait_bounded(t);
  expect_error([&] { t.wait(); }, ErrorKind::kIo, {"0 bytes"});
}

TEST(TierFaults, ConcurrentCallersFromManyThreads) {
  TempDir a, b;
  auto copier = make_host_copier();
  TierStore store(*copier, config_for({a.path(), b.path()}));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const std::uint64_t n = 1 + static_cast<std::uint64_t>((t * 37 + i * 7919) % 150000);
        const auto data = pattern(n, static_cast<std::uint32_t>(t * 1000 + i));
        std::vector<std::byte> back(n);
        const TierKind tier = (i + t) % 4 == 0 ? TierKind::kHost : TierKind::kSsd;
        auto extent = store.allocate(tier, n);
        if (!extent) continue;  // a full tier is a valid answer under contention
        store.write(*extent, data.data(), MemoryKind::kDevice).wait();
        store.read(*extent, back.data(), MemoryKind::kHost).wait();
        if (back != data) ++mismatches;
        store.release(*extent);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(store.report().host_used, 0u);
}

TEST(TierFaults, HostAndSsdTierFullAreResultsNotExceptions) {
  TempDir dir;
  auto copier = make_host_copier();
  TierStore store(*copier, config_for({dir.path()}));
  std::vector<Extent> held;
  while (auto extent = store.allocate(TierKind::kHost, 100 * kKiB)) held.push_back(*extent);
  EXPECT_EQ(held.size(), 10u);  // 1 MiB / 100 KiB (page-rounded)
  EXPECT_LE(store.report().host_used, store.report().host_capacity);
  EXPECT_FALSE(store.allocate(TierKind::kHost, 2 * kMiB));
  EXPECT_FALSE(store.allocate(TierKind::kSsd, 9 * kMiB));
  for (const auto& extent : held) store.release(extent);
  EXPECT_EQ(store.report().host_used, 0u);
  EXPECT_TRUE(store.allocate(TierKind::kHost, 1 * kMiB));
}

TEST(TierFaults, ShutdownWithTransfersInFlightCompletesOrCancelsEveryOne) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = config_for({dir.path()});
  with_faults(config, {.delay = 2ms});
  auto store = std::make_unique<TierStore>(*copier, config);
  const auto data = pattern(256 * kKiB, 3);
  std::vector<Transfer> transfers;
  for (int i = 0; i < 24; ++i) {
    auto extent = *store->allocate(TierKind::kSsd, data.size());
    transfers.push_back(store->write(extent, data.data(), MemoryKind::kDevice));
  }
  store->shutdown();
  int completed = 0;
  int cancelled = 0;
  for (const auto& t : transfers) {
    ASSERT_TRUE(t.wait_for(30s)) << "hang after shutdown";
    try {
      t.wait();
      ++completed;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kShutdown) << e.what();
      ++cancelled;
    }
  }
  EXPECT_EQ(completed + cancelled, 24);
  EXPECT_GT(cancelled, 0) << "with 2 ms per request, shutdown should find queued transfers";
  auto late = store->allocate(TierKind::kSsd, 10);
  ASSERT_TRUE(late);
  expect_error([&] { store->write(*late, data.data(), MemoryKind::kHost).wait(); }, ErrorKind::kShutdown, {});
  store.reset();  // destruction after shutdown: no hang, no crash
}

TEST(TierFaults, DestructionWithTransfersInFlightDoesNotHang) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = config_for({dir.path()});
  with_faults(config, {.delay = 1ms});
  const auto data = pattern(128 * kKiB, 4);
  std::vector<Transfer> transfers;
  {
    TierStore store(*copier, config);
    for (int i = 0; i < 16; ++i) {
      transfers.push_back(
          store.write(*store.allocate(TierKind::kSsd, data.size()), data.data(), MemoryKind::kHost));
    }
  }
  for (const auto& t : transfers) EXPECT_TRUE(t.ready());
}

TEST(TierFaults, ReleaseWithTransferInFlightIsRefused) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = config_for({dir.path()});
  with_faults(config, {.delay = 20ms});
  TierStore store(*copier, config);
  const auto data = pattern(64 * kKiB, 8);
  auto extent = *store.allocate(TierKind::kSsd, data.size());
  const Transfer t = store.write(extent, data.data(), MemoryKind::kHost);
  expect_error([&] { store.release(extent); }, ErrorKind::kInvalidArgument, {"in flight"});
  t.wait();
  store.release(extent);
}

TEST(TierFaults, CorruptionBehindTheEnginesBackIsAChecksumErrorNamingTheExtent) {
  TempDir a, b;
  auto copier = make_host_copier();
  EngineConfig config = config_for({a.path(), b.path()});
  config.checksums = true;
  TierStore store(*copier, config);
  const auto data = pattern(300000, 21);
  auto extent = *store.allocate(TierKind::kSsd, data.size());
  store.write(extent, data.data(), MemoryKind::kDevice, "block7.mlp.fc1.weight").wait();
  std::vector<std::byte> back(data.size());
  store.read(extent, back.data(), MemoryKind::kDevice).wait();
  ASSERT_EQ(back, data);

  const ExtentPlacement victim = store.placement(extent).at(2);
  const int fd = ::open(victim.path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const char garbage[3] = {'b', 'a', 'd'};
  ASSERT_EQ(::pwrite(fd, garbage, sizeof garbage, static_cast<off_t>(victim.file_offset + 100)), 3);
  ::fsync(fd);
  ::close(fd);

  const Transfer t = store.read(extent, back.data(), MemoryKind::kDevice);
  wait_bounded(t);
  expect_error([&] { t.wait(); }, ErrorKind::kChecksum, {"block7.mlp.fc1.weight", "ssd", victim.path});
}

TEST(TierFaults, HostTierChecksumsRoundTrip) {
  auto copier = make_host_copier();
  EngineConfig config = config_for({});
  config.checksums = true;
  TierStore store(*copier, config);
  const auto data = pattern(5000, 2);
  std::vector<std::byte> back(data.size());
  auto extent = *store.allocate(TierKind::kHost, data.size());
  store.write(extent, data.data(), MemoryKind::kDevice, "x").wait();
  store.read(extent, back.data(), MemoryKind::kDevice).wait();
  EXPECT_EQ(back, data);
  EXPECT_FALSE(store.allocate(TierKind::kSsd, 1)) << "no SSD tier configured";
}

// One swap file serving two stripes (or two stores) would put different tensors at the same
// offsets: the second user is refused instead of silently corrupting the first one's data.
TEST(TierFaults, OneSwapFileUsedTwiceIsRefused) {
  TempDir dir;
  auto copier = make_host_copier();
  expect_error(
      [&] {
        TierStore store(*copier, config_for({dir.path(), dir.path() + "/"}));
      },
      ErrorKind::kInvalidArgument, {"already in use", dir.path()});
  TierStore first(*copier, config_for({dir.path()}));
  expect_error([&] { TierStore second(*copier, config_for({dir.path()})); }, ErrorKind::kInvalidArgument,
               {"already in use"});
  EngineConfig other_rank = config_for({dir.path()});
  other_rank.rank = 1;
  EXPECT_NO_THROW(TierStore third(*copier, other_rank));
}

TEST(TierFaults, BadConfigurationIsRejected) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = config_for({dir.path()});
  config.chunk_bytes = 1000;
  expect_error([&] { TierStore store(*copier, config); }, ErrorKind::kInvalidArgument, {"chunk"});
  config = config_for({dir.path()});
  config.stripe_unit = 5000;
  expect_error([&] { TierStore store(*copier, config); }, ErrorKind::kInvalidArgument, {"stripe"});
  config = config_for({dir.path()});
  config.ssd_capacity_per_path = 0;
  expect_error([&] { TierStore store(*copier, config); }, ErrorKind::kInvalidArgument, {"capacity"});
  EXPECT_THROW(parse_backend_choice("aio"), Error);
  EXPECT_EQ(parse_backend_choice("io_uring"), BackendChoice::kIoUring);
}

}  // namespace
}  // namespace teraio::io
