// The cuFile shim against a stand-in library (cufile_fake_library.cpp) that fails on request:
// driver open failures, 5027 at registration, short transfers to resume, negative returns to
// decode. Each case runs in a fresh process (the driver is opened once per process).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/io/cufile.hpp"

namespace teraio::io {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs check in a child process with the fake library in the given mode; the child prints
// "fake-cufile: ok" and exits 0 when check found nothing wrong.
void run_with_fake(const char* mode, const std::function<std::string()>& check) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TERAIO_CUFILE_LIBRARY", TERAIO_FAKE_CUFILE_PATH, 1);
        setenv("TERAIO_FAKE_CUFILE", mode, 1);
        const std::string problems = check();
        std::fprintf(stderr, "%s\n", problems.empty() ? "fake-cufile: ok" : problems.c_str());
        std::_Exit(problems.empty() ? 0 : 1);
      },
      testing::ExitedWithCode(0), "fake-cufile: ok");
}

// Error text of what(), or "" when it did not throw the expected kind.
std::string error_of(const std::function<void()>& what, ErrorKind kind, int* sys_errno = nullptr) {
  try {
    what();
  } catch (const Error& e) {
    if (sys_errno != nullptr) *sys_errno = e.sys_errno();
    return e.kind() == kind ? e.what() : cat("wrong kind: ", e.what());
  }
  return "";
}

class DevNull {
 public:
  DevNull() : fd_(open("/dev/null", O_RDWR)) {}
  ~DevNull() { close(fd_); }
  DevNull(const DevNull&) = delete;
  DevNull& operator=(const DevNull&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

TEST(CuFileFakeDeathTest, DriverOpenFailureIsDecodedAndHandlesRefused) {
  run_with_fake("open_fails", [] {
    std::string problems;
    const CuFileStatus& s = CuFileDriver::instance().status();
    if (!s.library_loaded || s.driver_open) problems += "expected loaded and not open; ";
    if (!contains(s.detail, "5001 CU_FILE_DRIVER_NOT_INITIALIZED"))
      problems += cat("detail: ", s.detail, "; ");
    DevNull file;
    const std::string e = error_of([&] { CuFileHandle h(file.fd(), "fake/file"); }, ErrorKind::kCuFile);
    if (!contains(e, "cuFile unavailable")) problems += cat("handle: '", e, "'; ");
    return problems;
  });
}

TEST(CuFileFakeDeathTest, ADriverOpenedElsewhereInTheProcessIsUsable) {
  run_with_fake("already_open", [] {
    return CuFileDriver::instance().usable() ? std::string() : CuFileDriver::instance().status().detail;
  });
}

TEST(CuFileFakeDeathTest, Registration5027IsAcleanDecodedError) {
  run_with_fake("register_fails", [] {
    std::string problems;
    const CuFileStatus& s = CuFileDriver::instance().status();
    if (!s.driver_open || s.nvfs_present) problems += "expected open without nvfs; ";
    if (!contains(s.detail, "nvidia-fs version 0.0 (absent")) problems += cat("detail: ", s.detail, "; ");
    DevNull file;
    const std::string e = error_of([&] { CuFileHandle h(file.fd(), "fake/file"); }, ErrorKind::kCuFile);
    if (!contains(e, "cuFileHandleRegister(fake/file): 5027 CU_FILE_HANDLE_NOT_REGISTERED")) {
      problems += cat("handle: '", e, "'; ");
    }
    return problems;
  });
}

TEST(CuFileFakeDeathTest, ShortTransfersAreResumedWithTheRightOffsets) {
  run_with_fake("ok", [] {
    std::string problems;
    DevNull file;
    CuFileHandle h(file.fd(), "fake/file");
    std::vector<unsigned char> buffer(5000, 0);
    h.read(buffer.data(), buffer.size(), 100);  // five calls of at most 1000 bytes
    for (std::size_t i = 0; i < buffer.size(); ++i) {
      if (buffer[i] != static_cast<unsigned char>((100 + i) & 0xff)) {
        problems += cat("read byte ", i, " wrong; ");
        break;
      }
    }
    for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<unsigned char>((200 + i) & 0xff);
    h.write(buffer.data(), 4000, 200);  // three calls of at most 1500 bytes, checked by the fake
    const std::string eof = error_of([&] { h.read(buffer.data(), 10, (1 << 20) - 5); }, ErrorKind::kIo);
    if (!contains(eof, "unexpected end of file")) problems += cat("eof: '", eof, "'; ");
    CuFileBufferRegistration registration(buffer.data(), buffer.size());
    return problems;
  });
}

TEST(CuFileFakeDeathTest, NegativeTransferResultsAreDecoded) {
  run_with_fake("io_errors", [] {
    std::string problems;
    DevNull file;
    CuFileHandle h(file.fd(), "fake/file");
    std::vector<unsigned char> buffer(4096);
    const std::string r = error_of([&] { h.read(buffer.data(), buffer.size(), 0); }, ErrorKind::kCuFile);
    if (!contains(r, "cuFileRead(fake/file, offset 0, 4096 bytes): 5020 CU_FILE_DIO_NOT_SET")) {
      problems += cat("read: '", r, "'; ");
    }
    int err = 0;
    const std::string w =
        error_of([&] { h.write(buffer.data(), buffer.size(), 8192); }, ErrorKind::kCuFile, &err);
    if (!contains(w, "offset 8192") || !contains(w, "errno 5") || err != 5)
      problems += cat("write: '", w, "'; ");
    return problems;
  });
}

TEST(CuFileFakeDeathTest, NvfsVersionMeansTrueGdsIsPossible) {
  run_with_fake("nvfs", [] {
    const CuFileStatus& s = CuFileDriver::instance().status();
    return s.nvfs_present && contains(s.detail, "nvidia-fs version 2.17 (present)")
               ? std::string()
               : cat("detail: ", s.detail);
  });
}

}  // namespace
}  // namespace teraio::io
