// io/paged_device_memory_parts: what the two halves of PagedDeviceMemory share (its requests
// and blocks in paged_device_memory.cpp; where a request's pages come from and how the pages of
// freed blocks taken are unmapped, in paged_device_memory_pages.cpp). Private to src/io.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "teraio/io/paged_device_memory.hpp"

namespace teraio::io {

// Adds the seconds from its construction to its end to `total`; where given, a stretch longer
// than kSlowDriverStretch is also counted in `slow` and its seconds added to `slow_total`.
class DriverStopwatch {
 public:
  explicit DriverStopwatch(double& total, std::uint64_t* slow = nullptr, double* slow_total = nullptr)
      : total_(total), slow_(slow), slow_total_(slow_total), start_(std::chrono::steady_clock::now()) {}
  ~DriverStopwatch() {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    total_ += s;
    if (slow_ != nullptr && s > kSlowDriverStretch) {
      ++*slow_;
      *slow_total_ += s;
    }
  }
  DriverStopwatch(const DriverStopwatch&) = delete;
  DriverStopwatch& operator=(const DriverStopwatch&) = delete;

 private:
  double& total_;
  std::uint64_t* slow_;
  double* slow_total_;
  std::chrono::steady_clock::time_point start_;
};

// Events recorded when a block was freed, one per stream that used it, and the marks of freed
// neighbours joined to it. Shared by the parts of a block cut in two and by its pages taken;
// each event goes back to the driver with the last owner.
struct PagedDeviceMemory::Marks {
  PageDriver* driver = nullptr;
  std::vector<std::pair<StreamHandle, StreamMark>> marks;
  std::vector<SharedMarks> joined;
  bool all_passed = false;
  Marks() = default;
  Marks(const Marks&) = delete;
  Marks& operator=(const Marks&) = delete;
  ~Marks() {
    for (const auto& entry : marks) driver->drop(entry.second);
  }
};

}  // namespace teraio::io
