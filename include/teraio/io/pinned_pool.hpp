// io/pinned_pool: page-locked host memory for DMA. PinnedRegion is one anonymous mapping
// pinned through DeviceCopier::pin (cudaHostRegister on CUDA; never cudaHostAlloc, whose
// memory io_uring cannot register). PinnedBufferPool cuts one region into equal,
// page-aligned bounce buffers handed out as RAII handles and reused: its byte cap is the
// region size, fixed at construction, so the pool never grows.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "teraio/io/device_copy.hpp"
#include "teraio/io/numa.hpp"

namespace teraio::io {

class PinnedRegion {
 public:
  // Maps align_up(bytes, page) bytes, preferring the copier's device's NUMA node where the
  // machine has several. Pins them now unless pin_now is false (then call pin()).
  PinnedRegion(DeviceCopier& copier, std::size_t bytes, bool pin_now = true);
  ~PinnedRegion();
  PinnedRegion(const PinnedRegion&) = delete;
  PinnedRegion& operator=(const PinnedRegion&) = delete;

  // Pins the mapping if not pinned yet; safe to call from a background thread once.
  void pin();
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool pinned() const { return pinned_; }
  // The node asked for and where a sample of the pages is (pages not yet pinned: not placed).
  std::string numa() const { return placement_.describe(data_, size_); }

 private:
  DeviceCopier& copier_;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool pinned_ = false;
  NumaPlacement placement_;
};

class PinnedBufferPool;

// One buffer of the pool; returns itself to the pool when destroyed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class PinnedBufferPool;
  PinnedBuffer(PinnedBufferPool* pool, std::byte* data, std::size_t size)
      : pool_(pool), data_(data), size_(size) {}
  void reset();

  PinnedBufferPool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

class PinnedBufferPool {
 public:
  // buffer_bytes is rounded up to a page; cap_bytes (rounded down to whole buffers, at least
  // one buffer) is all the pinned memory the pool ever holds.
  PinnedBufferPool(DeviceCopier& copier, std::size_t buffer_bytes, std::size_t cap_bytes);
  // Every buffer must have been returned (a bug otherwise, checked in debug builds).
  ~PinnedBufferPool();
  PinnedBufferPool(const PinnedBufferPool&) = delete;
  PinnedBufferPool& operator=(const PinnedBufferPool&) = delete;

  // Blocks until a buffer is free.
  PinnedBuffer acquire();
  std::optional<PinnedBuffer> try_acquire();

  std::size_t buffer_bytes() const { return buffer_bytes_; }
  std::size_t buffer_count() const { return count_; }
  std::size_t available() const;
  // The whole pinned range, for io_uring buffer registration.
  std::byte* region_data() const { return region_.data(); }
  std::size_t region_size() const { return region_.size(); }

 private:
  friend class PinnedBuffer;
  void give_back(std::byte* data);

  std::size_t buffer_bytes_;
  std::size_t count_;
  PinnedRegion region_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<std::byte*> free_;
};

}  // namespace teraio::io
