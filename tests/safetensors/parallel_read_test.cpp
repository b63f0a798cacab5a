// The buffered read path (several pread threads) and bounce pools kept across loads: exact bytes
// for every thread count and destination, failures reported with path and offset after every
// copy has finished, and a caller's pool reused without growing or losing buffers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "chunked_read.hpp"
#include "st_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/io/pinned_pool.hpp"
#include "teraio/safetensors/loader.hpp"
#include "teraio/safetensors/writer.hpp"

namespace teraio::safetensors {
namespace {

using testing::pattern;
using testing::TempDir;

class ParallelReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = pattern(1000000, 11);
    std::ofstream(path_, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes_.data()), static_cast<std::streamsize>(bytes_.size()));
    fd_ = ::open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { ::close(fd_); }

  detail::ParallelRead read(std::uint64_t offset, std::uint64_t length, std::byte* dst, bool device,
                            unsigned threads) {
    detail::ParallelRead r;
    r.fd = fd_;
    r.copier = copier_.get();
    r.path = path_;
    r.file_offset = offset;
    r.length = length;
    r.destination = dst;
    r.destination_is_device = device;
    r.chunk_bytes = 3 * 8192;  // pieces of 12 KiB: many per thread, and a short last one
    r.threads = threads;
    return r;
  }

  TempDir dir_;
  std::string path_ = dir_.file("data.bin");
  std::vector<std::byte> bytes_;
  int fd_ = -1;
  std::unique_ptr<io::DeviceCopier> copier_ = io::make_host_copier();
};

TEST_F(ParallelReadTest, EveryThreadCountAndDestinationLandsTheExactBytes) {
  for (const bool device : {false, true}) {
    for (const unsigned threads : {1u, 2u, 5u, 64u}) {
      std::vector<std::byte> dst(bytes_.size() - 1001);
      detail::run_parallel_read(read(1001, dst.size(), dst.data(), device, threads));
      EXPECT_EQ(std::memcmp(dst.data(), bytes_.data() + 1001, dst.size()), 0)
          << "device " << device << ", threads " << threads;
    }
  }
}

TEST_F(ParallelReadTest, CallersPoolIsReusedAndGetsEveryBufferBack) {
  io::PinnedBufferPool pool(*copier_, 16384, 3 * 16384);
  for (int load = 0; load < 3; ++load) {
    std::vector<std::byte> dst(300000 + static_cast<std::size_t>(load));
    detail::ParallelRead r = read(7, dst.size(), dst.data(), true, 8);
    r.bounce_pool = &pool;
    detail::run_parallel_read(r);
    EXPECT_EQ(std::memcmp(dst.data(), bytes_.data() + 7, dst.size()), 0) << "load " << load;
    EXPECT_EQ(pool.available(), pool.buffer_count());
  }
}

TEST_F(ParallelReadTest, FileEndingEarlyIsReported) {
  for (const bool device : {false, true}) {
    std::vector<std::byte> dst(bytes_.size());
    try {
      detail::run_parallel_read(read(500, dst.size(), dst.data(), device, 3));
      FAIL() << "device " << device;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat);
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    }
  }
}

TEST_F(ParallelReadTest, FailureNamesPathOffsetAndErrno) {
  const int write_only = ::open(path_.c_str(), O_WRONLY);
  ASSERT_GE(write_only, 0);
  std::vector<std::byte> dst(100000);
  detail::ParallelRead r = read(0, dst.size(), dst.data(), true, 4);
  r.fd = write_only;
  try {
    detail::run_parallel_read(r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_EQ(e.sys_errno(), EBADF);
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at offset"), std::string::npos) << e.what();
  }
  ::close(write_only);
}

// The O_DIRECT pipeline with a caller's pool: chunks take the pool's buffer size, no more reads
// than chunks_in_flight run although the pool holds more buffers, and all come back.
TEST(DirectWithPool, ChunksTakeThePoolsBufferSize) {
  TempDir dir;
  const std::string path = dir.file("direct.bin");
  const std::vector<std::byte> bytes = pattern(200000, 3);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  auto copier = io::make_host_copier();
  auto backend = io::make_posix_backend(fd, 2);
  io::PinnedBufferPool pool(*copier, 8192, 6 * 8192);
  for (const bool device : {false, true}) {
    std::vector<std::byte> dst(199000);
    detail::ChunkedRead r;
    r.backend = backend.get();
    r.copier = copier.get();
    r.path = path;
    r.file_offset = 999;
    r.length = dst.size();
    r.destination = dst.data();
    r.destination_is_device = device;
    r.direct = true;
    r.chunk_bytes = 1 << 20;  // overruled by the pool's 8 KiB buffers
    r.chunks_in_flight = 2;
    r.bounce_pool = &pool;
    detail::run_chunked_read(r);
    EXPECT_EQ(std::memcmp(dst.data(), bytes.data() + 999, dst.size()), 0) << "device " << device;
    EXPECT_EQ(pool.available(), pool.buffer_count());
  }
  ::close(fd);
}

TEST(BouncePool, LoadsReuseOnePoolThatSuitsTheirOptions) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  std::vector<std::byte> data = pattern(300001, 5);
  save_file({{"x", Dtype::kU8, {300001}, data.data()}}, {}, path, {});
  auto copier = io::make_host_copier();
  LoadOptions options;
  options.chunk_bytes = 40000;  // rounded up to two pages' multiple: 40960
  options.chunks_in_flight = 3;
  options.threads = 5;
  const std::unique_ptr<io::PinnedBufferPool> pool = make_bounce_pool(*copier, options);
  EXPECT_EQ(pool->buffer_bytes(), 40960u);
  EXPECT_EQ(pool->buffer_count(), 5u);
  EXPECT_TRUE(bounce_pool_suits(*pool, options));
  options.bounce_pool = pool.get();
  for (const IoMode mode : {IoMode::kBuffered, IoMode::kDirect, IoMode::kBuffered}) {
    options.io_mode = mode;
    const LoadedFile loaded = load_file(path, *copier, options);
    ASSERT_EQ(loaded.buffer.size(), data.size());
    EXPECT_EQ(std::memcmp(loaded.buffer.data(), data.data(), data.size()), 0) << to_string(mode);
    EXPECT_EQ(loaded.stats.mode, to_string(mode));
    EXPECT_EQ(pool->available(), pool->buffer_count());
  }
  LoadOptions other = options;
  other.chunk_bytes = 1 << 20;
  EXPECT_FALSE(bounce_pool_suits(*pool, other));
  other = options;
  other.threads = 9;
  EXPECT_FALSE(bounce_pool_suits(*pool, other));
  EXPECT_GE(default_read_threads(), 1u);
  EXPECT_LE(default_read_threads(), 16u);
}

}  // namespace
}  // namespace teraio::safetensors
