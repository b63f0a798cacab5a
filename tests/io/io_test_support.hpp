// Shared helpers of the io tests: temporary directories, byte patterns, a fault-injecting backend.
#pragma once

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "teraio/io/io_backend.hpp"

namespace teraio::io::testing {

// A fresh directory under /tmp (or under base), removed with its contents on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "/tmp") {
    std::string pattern = base + "/teraio-io-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed under " + base);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Bytes that differ at every offset and between seeds, so a misplaced chunk is caught.
inline std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> out(n);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    out[i] = static_cast<std::byte>((x >> 16) ^ (i >> 12));
  }
  return out;
}

// Wraps a real backend: fails request number fail_at (1-based, counting every submission)
// with -fail_errno, and/or carries out only half of each request (in 512-byte blocks) to
// exercise short-transfer resumption; can also claim 0 bytes forever.
class FaultyBackend final : public IoBackend {
 public:
  struct Faults {
    std::uint64_t fail_at = 0;  // 0: never
    int fail_errno = 5;         // EIO
    bool short_transfers = false;
    bool zero_reads = false;             // reads report 0 bytes (end of file)
    std::chrono::milliseconds delay{0};  // slows every submission down
  };
  FaultyBackend(std::unique_ptr<IoBackend> real, Faults faults) : real_(std::move(real)), faults_(faults) {}
  std::string name() const override { return "faulty(" + real_->name() + ")"; }
  bool register_buffer(void* data, std::size_t size) override { return real_->register_buffer(data, size); }
  void submit(const IoRequest& request, IoCompletion done) override {
    const std::uint64_t n = ++submitted_;
    if (faults_.delay.count() > 0) std::this_thread::sleep_for(faults_.delay);
    if (faults_.fail_at != 0 && n == faults_.fail_at) {
      done(-faults_.fail_errno);
      return;
    }
    if (faults_.zero_reads && request.direction == IoDirection::kRead) {
      done(0);
      return;
    }
    // Like the kernel on O_DIRECT, a short transfer still moves whole 512-byte blocks.
    const std::size_t half = request.length / 2 / 512 * 512;
    const bool shorten = faults_.short_transfers && half > 0;
    if (!shorten) {
      real_->submit(request, std::move(done));
      return;
    }
    IoRequest part = request;
    part.length = half;
    shortened_ += 1;
    real_->submit(part, std::move(done));
  }
  std::uint64_t submitted() const { return submitted_; }
  std::uint64_t shortened() const { return shortened_; }

 private:
  std::unique_ptr<IoBackend> real_;
  Faults faults_;
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> shortened_{0};
};

}  // namespace teraio::io::testing
