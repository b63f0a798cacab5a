// io/extent_allocator: space management of one tier region (a host arena or one swap file).
// Hands out page-aligned byte ranges, reuses released space (neighbours are coalesced) and
// never exceeds its capacity. Best fit, O(log n) per call. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "teraio/core/units.hpp"

namespace teraio::io {

class ExtentAllocator {
 public:
  // capacity is rounded down to the alignment; alignment must be a power of two.
  explicit ExtentAllocator(std::uint64_t capacity, std::uint64_t alignment = kPageSize);

  // Offset of a free range of align_up(bytes) bytes, or nullopt when no free range is large
  // enough ("tier full"). bytes == 0 reserves one alignment unit so that every extent has a
  // distinct offset.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  // Returns a range obtained from allocate(offset, bytes) with the same byte count.
  // Throws Error{kInvalidArgument} for a range that is not currently allocated.
  void release(std::uint64_t offset, std::uint64_t bytes);

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t used() const;
  std::uint64_t largest_free() const;
  // Number of separate free ranges: 1 after everything is released (coalescing works).
  std::size_t free_ranges() const;
  // The size actually reserved for a request of bytes.
  std::uint64_t reserved_size(std::uint64_t bytes) const;

 private:
  void insert_free(std::uint64_t offset, std::uint64_t length);
  void erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::uint64_t capacity_;
  std::uint64_t alignment_;
  mutable std::mutex mutex_;
  std::uint64_t used_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_by_offset_;             // offset -> length
  std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_length_;  // (length, offset)
  std::map<std::uint64_t, std::uint64_t> allocated_;                  // offset -> length
};

}  // namespace teraio::io
