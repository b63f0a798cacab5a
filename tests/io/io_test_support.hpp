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

#include "support/temp_dir.hpp"
#include "teraio/io/io_backend.hpp"

namespace teraio::io::testing {

using teraio::testing::pattern;
using teraio::testing::TempDir;

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
