// The io_uring backend when the kernel refuses a submission: the request must fail with an
// error, never wait forever for a completion that cannot come, and shutdown must not hang.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "io_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::io {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::TempDir;

std::set<int> ring_fds() {
  std::set<int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(entry.path(), ec);
    if (!ec && target.string().find("io_uring") != std::string::npos)
      out.insert(std::stoi(entry.path().filename()));
  }
  return out;
}

// Points every ring created since `before` at /dev/null: io_uring_enter then fails with
// EOPNOTSUPP, the way a kernel refusing submissions would, while the mapped rings stay valid.
void break_rings_created_after(const std::set<int>& before) {
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(null_fd, 0);
  int broken = 0;
  for (int fd : ring_fds()) {
    if (before.count(fd) != 0) continue;
    ASSERT_GE(::dup2(null_fd, fd), 0);
    ++broken;
  }
  ::close(null_fd);
  ASSERT_GT(broken, 0) << "no io_uring found in /proc/self/fd";
}

TEST(UringBackend, RefusedSubmissionThrowsAndShutdownDoesNotHang) {
  if (!uring_compiled_in()) GTEST_SKIP() << "built without liburing";
  TempDir dir;
  const std::string file = dir.path() + "/data";
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  const auto before = ring_fds();
  std::unique_ptr<IoBackend> backend;
  try {
    backend = make_uring_backend(fd, 2);
  } catch (const Error& e) {
    ::close(fd);
    GTEST_SKIP() << "io_uring unavailable: " << e.what();
  }
  break_rings_created_after(before);
  std::vector<std::byte> bytes = pattern(4096, 1);
  IoRequest request{IoDirection::kWrite, bytes.data(), bytes.size(), 0, -1};
  bool completed = false;
  try {
    backend->submit(request, [&](std::int64_t) { completed = true; });
    ADD_FAILURE() << "a refused submission must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find("io_uring_submit"), std::string::npos) << e.what();
  }
  backend.reset();  // must not wait for the refused request
  EXPECT_FALSE(completed) << "the completion of a request that submit() threw for must never run";
  ::close(fd);
}

TEST(UringBackend, RefusedSubmissionFailsTheTransferAndTheStoreShutsDown) {
  if (!uring_compiled_in()) GTEST_SKIP() << "built without liburing";
  TempDir dir;
  EngineConfig config;
  config.ssd_paths = {dir.path()};
  config.ssd_capacity_per_path = 1 * kMiB;
  config.stripe_unit = 64 * kKiB;
  config.chunk_bytes = 16 * kKiB;
  config.bounce_pool_bytes = 64 * kKiB;
  config.queue_depth = 2;
  config.backend = BackendChoice::kIoUring;
  auto copier = make_host_copier();
  const auto before = ring_fds();
  std::optional<TierStore> store;
  try {
    store.emplace(*copier, config);
  } catch (const Error& e) {
    GTEST_SKIP() << "io_uring unavailable: " << e.what();
  }
  break_rings_created_after(before);
  auto extent = store->allocate(TierKind::kSsd, 200 * kKiB);
  ASSERT_TRUE(extent);
  const std::vector<std::byte> data = pattern(extent->bytes, 7);
  const Transfer write = store->write(*extent, data.data(), MemoryKind::kHost, "t0");
  ASSERT_TRUE(write.wait_for(30s)) << "a transfer whose submission the kernel refused hung";
  EXPECT_THROW(write.wait(), Error);
  store.reset();  // destruction with a broken ring must not hang
}

}  // namespace
}  // namespace teraio::io
