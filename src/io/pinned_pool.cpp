#include "teraio/io/pinned_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {

PinnedRegion::PinnedRegion(DeviceCopier& copier, std::size_t bytes, bool pin_now)
    : copier_(copier), size_(align_up(std::max<std::size_t>(bytes, 1), kPageSize)) {
  // MAP_NORESERVE: pages are faulted in by pinning (CUDA) or by first use (host copier).
  void* mapped =
      mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) throw_errno(errno, "mmap of ", format_bytes(size_), " of pinned memory");
  data_ = static_cast<std::byte*>(mapped);
  // Before pinning faults the pages in: they come from the node the policy names.
  placement_ = place_near(data_, size_, copier_.numa_node());
  if (pin_now) {
    try {
      pin();
    } catch (...) {
      munmap(data_, size_);
      throw;
    }
  }
}

void PinnedRegion::pin() {
  if (pinned_) return;
  copier_.pin(data_, size_);
  pinned_ = true;
}

PinnedRegion::~PinnedRegion() {
  if (pinned_) {
    try {
      copier_.unpin(data_);
    } catch (const std::exception& e) {
      log::warn("unpinning ", format_bytes(size_), " failed: ", e.what());
    }
  }
  munmap(data_, size_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  reset();
}

void PinnedBuffer::reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->give_back(data_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

namespace {
std::size_t buffer_count_for(std::size_t buffer_bytes, std::size_t cap_bytes) {
  if (buffer_bytes == 0) throw Error(ErrorKind::kInvalidArgument, "pinned buffer size must be positive");
  return std::max<std::size_t>(1, cap_bytes / align_up(buffer_bytes, kPageSize));
}
}  // namespace

PinnedBufferPool::PinnedBufferPool(DeviceCopier& copier, std::size_t buffer_bytes, std::size_t cap_bytes)
    : buffer_bytes_(align_up(buffer_bytes, kPageSize)),
      count_(buffer_count_for(buffer_bytes, cap_bytes)),
      region_(copier, buffer_bytes_ * count_) {
  free_.reserve(count_);
  for (std::size_t i = count_; i > 0; --i) free_.push_back(region_.data() + (i - 1) * buffer_bytes_);
}

PinnedBufferPool::~PinnedBufferPool() {
  std::unique_lock lock(mutex_);
  if (free_.size() != count_)
    log::error("pinned buffer pool destroyed with ", count_ - free_.size(), " buffers out");
}

PinnedBuffer PinnedBufferPool::acquire() {
  std::unique_lock lock(mutex_);
  freed_.wait(lock, [this] { return !free_.empty(); });
  std::byte* data = free_.back();
  free_.pop_back();
  return PinnedBuffer(this, data, buffer_bytes_);
}

std::optional<PinnedBuffer> PinnedBufferPool::try_acquire() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) return std::nullopt;
  std::byte* data = free_.back();
  free_.pop_back();
  return PinnedBuffer(this, data, buffer_bytes_);
}

std::size_t PinnedBufferPool::available() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

void PinnedBufferPool::give_back(std::byte* data) {
  // Notified under the lock: once the last buffer is back the owner may destroy the pool, and
  // an unlocked notify could then touch a destroyed condition variable.
  std::lock_guard lock(mutex_);
  free_.push_back(data);
  freed_.notify_one();
}

}  // namespace teraio::io
