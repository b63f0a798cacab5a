// The loader's read pipeline on its own: short transfers resumed, failures and a file that
// ends early reported with path and offset, every mode landing the exact bytes.
#include "chunked_read.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "st_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/io/io_backend.hpp"

namespace teraio::safetensors {
namespace {

using testing::pattern;
using testing::TempDir;

// Carries out only half of each request (in 512-byte blocks), or fails request fail_at with
// -fail_errno.
class HalvingBackend final : public io::IoBackend {
 public:
  HalvingBackend(int fd, int fail_at, int fail_errno = EIO)
      : inner_(io::make_posix_backend(fd, 2)), fail_at_(fail_at), fail_errno_(fail_errno) {}
  std::string name() const override { return "halving"; }
  void submit(const io::IoRequest& request, io::IoCompletion done) override {
    if (++count_ == fail_at_) {
      done(-fail_errno_);
      return;
    }
    io::IoRequest half = request;
    if (half.length > 1024) half.length = half.length / 2 / 512 * 512;
    inner_->submit(half, std::move(done));
  }
  bool register_buffer(void*, std::size_t) override { return false; }

 private:
  std::unique_ptr<io::IoBackend> inner_;
  int fail_at_;
  int fail_errno_;
  int count_ = 0;
};

class ChunkedReadTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    bytes_ = pattern(300000, 5);
    std::ofstream(path_, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes_.data()), static_cast<std::streamsize>(bytes_.size()));
    fd_ = ::open(path_.c_str(), O_RDONLY | (GetParam() ? O_DIRECT : 0));
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { ::close(fd_); }

  detail::ChunkedRead read(io::IoBackend& backend, std::uint64_t offset, std::uint64_t length,
                           std::byte* dst) {
    detail::ChunkedRead r;
    r.backend = &backend;
    r.copier = copier_.get();
    r.path = path_;
    r.file_offset = offset;
    r.length = length;
    r.destination = dst;
    r.direct = GetParam();
    r.chunk_bytes = 20000;
    r.chunks_in_flight = 3;
    return r;
  }

  TempDir dir_;
  std::string path_ = dir_.file("data.bin");
  std::vector<std::byte> bytes_;
  int fd_ = -1;
  std::unique_ptr<io::DeviceCopier> copier_ = io::make_host_copier();
};

TEST_P(ChunkedReadTest, ShortTransfersAreResumed) {
  HalvingBackend backend(fd_, 0);
  std::vector<std::byte> dst(299000);
  detail::run_chunked_read(read(backend, 1000, dst.size(), dst.data()));
  EXPECT_EQ(std::memcmp(dst.data(), bytes_.data() + 1000, dst.size()), 0);
}

TEST_P(ChunkedReadTest, FailureNamesPathAndOffset) {
  HalvingBackend backend(fd_, 4);
  std::vector<std::byte> dst(200000);
  try {
    detail::run_chunked_read(read(backend, 77, dst.size(), dst.data()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at offset"), std::string::npos) << e.what();
  }
}

// EAGAIN and EINTR mean the kernel moved nothing yet: the chunk is asked for again, as the
// tier store's IoOperation does, instead of failing the whole load.
TEST_P(ChunkedReadTest, TransientErrorsAreRetried) {
  for (const int transient : {EAGAIN, EINTR}) {
    HalvingBackend backend(fd_, 3, transient);
    std::vector<std::byte> dst(250000);
    detail::run_chunked_read(read(backend, 333, dst.size(), dst.data()));
    EXPECT_EQ(std::memcmp(dst.data(), bytes_.data() + 333, dst.size()), 0) << "errno " << transient;
  }
}

TEST_P(ChunkedReadTest, FileEndingEarlyIsReported) {
  auto backend = io::make_posix_backend(fd_, 2);
  std::vector<std::byte> dst(310000);
  try {
    detail::run_chunked_read(read(*backend, 5, dst.size(), dst.data()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, ChunkedReadTest, ::testing::Bool());

}  // namespace
}  // namespace teraio::safetensors
