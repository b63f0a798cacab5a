// cuFile shim: the error table decodes every documented code, and a machine without a usable
// cuFile (this CI machine) gets a clear status and clean errors, never a crash. On the GPU
// machine the same tests check that registration either succeeds or fails with a decoded code.
#include "teraio/io/cufile.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "teraio/core/error.hpp"

namespace teraio::io {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CuFileErrors, DecodesDocumentedCodesByName) {
  EXPECT_TRUE(contains(describe_cufile_error(0), "CU_FILE_SUCCESS"));
  EXPECT_TRUE(contains(describe_cufile_error(5001), "CU_FILE_DRIVER_NOT_INITIALIZED"));
  EXPECT_TRUE(contains(describe_cufile_error(5011), "CU_FILE_CUDA_DRIVER_ERROR"));
  const std::string handle = describe_cufile_error(5027);
  EXPECT_TRUE(contains(handle, "5027")) << handle;
  EXPECT_TRUE(contains(handle, "CU_FILE_HANDLE_NOT_REGISTERED")) << handle;
  EXPECT_TRUE(contains(describe_cufile_error(5038), "CU_FILE_ASYNC_NOT_SUPPORTED"));
}

TEST(CuFileErrors, EveryCodeInTheRangeHasAnAnswer) {
  for (int code = 5001; code <= 5039; ++code) {
    const std::string text = describe_cufile_error(code);
    EXPECT_TRUE(contains(text, std::to_string(code))) << text;
    const bool unassigned = code == 5021 || code == 5032;
    EXPECT_EQ(contains(text, "unknown"), unassigned) << text;
  }
  EXPECT_TRUE(contains(describe_cufile_error(5999), "unknown cuFile error code"));
  EXPECT_TRUE(contains(describe_cufile_error(-3), "unknown"));
}

TEST(CuFileErrors, DecodesNegativeTransferResults) {
  EXPECT_TRUE(contains(describe_cufile_io_result(-1, EIO), "errno 5"));
  EXPECT_TRUE(contains(describe_cufile_io_result(-5027, 0), "CU_FILE_HANDLE_NOT_REGISTERED"));
  EXPECT_TRUE(contains(describe_cufile_io_result(-5020, 0), "O_DIRECT"));
  EXPECT_TRUE(contains(describe_cufile_io_result(-123456789012LL, 0), "unexpected"));
  EXPECT_TRUE(contains(describe_cufile_io_result(4096, 0), "4096 bytes"));
}

TEST(CuFileDriver, StatusIsConsistentAndExplained) {
  const CuFileDriver& driver = CuFileDriver::instance();
  const CuFileStatus& status = driver.status();
  std::printf("cuFile status: loaded=%d driver_open=%d nvfs=%d: %s\n", status.library_loaded,
              status.driver_open, status.nvfs_present, status.detail.c_str());
  EXPECT_FALSE(status.detail.empty());
  EXPECT_TRUE(!status.driver_open || status.library_loaded);
  EXPECT_TRUE(!status.nvfs_present || status.driver_open);
  EXPECT_EQ(driver.usable(), status.library_loaded && status.driver_open);
  EXPECT_EQ(status.library_loaded, !status.library_path.empty());
  // The same object every time: the driver is opened once per process.
  EXPECT_EQ(&CuFileDriver::instance(), &driver);
}

// A fresh process (threadsafe death-test style re-executes the binary), so that the
// process-wide driver is created there under the environment variable.
TEST(CuFileDriverDeathTest, ALibraryWithoutCuFileSymbolsIsReportedNotUsed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TERAIO_CUFILE_LIBRARY", "libz.so.1", 1);
        const CuFileStatus& status = CuFileDriver::instance().status();
        std::fprintf(stderr, "%s\n", status.detail.c_str());
        std::_Exit(status.library_loaded || CuFileDriver::instance().usable() ? 1 : 0);
      },
      testing::ExitedWithCode(0), "lacks a cuFile symbol TeraIO needs");
}

class TempFile {
 public:
  TempFile() {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr ? dir : "/tmp") + "/teraio-cufile-test-XXXXXX";
    fd_ = mkstemp(path_.data());
    if (fd_ >= 0 && ftruncate(fd_, 1 << 20) != 0) ADD_FAILURE() << "ftruncate " << path_;
  }
  ~TempFile() {
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(CuFileHandle, UnusableDriverGivesACleanError) {
  if (CuFileDriver::instance().usable()) GTEST_SKIP() << "cuFile is usable here";
  TempFile file;
  ASSERT_GE(file.fd(), 0);
  try {
    CuFileHandle handle(file.fd(), file.path());
    FAIL() << "registration cannot succeed without a usable cuFile driver";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCuFile);
    EXPECT_TRUE(contains(e.what(), file.path())) << e.what();
    EXPECT_TRUE(contains(e.what(), "cuFile unavailable")) << e.what();
  }
  int word = 0;
  EXPECT_THROW(CuFileBufferRegistration(&word, sizeof word), Error);
}

TEST(CuFileHandle, RegistrationSucceedsOrFailsWithADecodedCode) {
  if (!CuFileDriver::instance().usable()) GTEST_SKIP() << CuFileDriver::instance().status().detail;
  TempFile file;
  ASSERT_GE(file.fd(), 0);
  const int fd = open(file.path().c_str(), O_RDWR | O_DIRECT);
  if (fd < 0) GTEST_SKIP() << "no O_DIRECT on " << file.path() << " (set TMPDIR to a disk directory)";
  try {
    CuFileHandle handle(fd, file.path());
    std::printf("cuFileHandleRegister(%s) succeeded (nvfs present: %d)\n", file.path().c_str(),
                CuFileDriver::instance().status().nvfs_present);
  } catch (const Error& e) {
    std::printf("cuFileHandleRegister failed as a decoded error: %s\n", e.what());
    EXPECT_EQ(e.kind(), ErrorKind::kCuFile);
    EXPECT_TRUE(contains(e.what(), "cuFileHandleRegister(" + file.path() + "): 50")) << e.what();
    EXPECT_FALSE(contains(e.what(), "unknown")) << e.what();
  }
  close(fd);
}

}  // namespace
}  // namespace teraio::io
