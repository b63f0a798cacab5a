#include "teraio/io/extent_allocator.hpp"

#include <iterator>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::io {

ExtentAllocator::ExtentAllocator(std::uint64_t capacity, std::uint64_t alignment)
    : capacity_(align_down(capacity, alignment == 0 ? 1 : alignment)), alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(ErrorKind::kInvalidArgument, cat("extent alignment ", alignment, " is not a power of two"));
  }
  if (capacity_ > 0) insert_free(0, capacity_);
}

std::uint64_t ExtentAllocator::reserved_size(std::uint64_t bytes) const {
  return bytes == 0 ? alignment_ : align_up(bytes, alignment_);
}

void ExtentAllocator::insert_free(std::uint64_t offset, std::uint64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_length_.emplace(length, offset);
}

void ExtentAllocator::erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  free_by_length_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<std::uint64_t> ExtentAllocator::allocate(std::uint64_t bytes) {
  if (bytes > capacity_) return std::nullopt;
  const std::uint64_t size = reserved_size(bytes);
  std::lock_guard lock(mutex_);
  // Best fit: the smallest free range that holds the request keeps large ranges whole.
  auto best = free_by_length_.lower_bound({size, 0});
  if (best == free_by_length_.end()) return std::nullopt;
  const auto [length, offset] = *best;
  erase_free(free_by_offset_.find(offset));
  if (length > size) insert_free(offset + size, length - size);
  allocated_.emplace(offset, size);
  used_ += size;
  return offset;
}

void ExtentAllocator::release(std::uint64_t offset, std::uint64_t bytes) {
  const std::uint64_t size = reserved_size(bytes);
  std::lock_guard lock(mutex_);
  auto found = allocated_.find(offset);
  if (found == allocated_.end() || found->second != size) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("release of extent at offset ", offset, " (", bytes, " bytes) that is not allocated"));
  }
  allocated_.erase(found);
  used_ -= size;
  std::uint64_t start = offset;
  std::uint64_t length = size;
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + size) {
    length += next->second;
    erase_free(next);
  }
  auto after = free_by_offset_.lower_bound(offset);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      length += prev->second;
      erase_free(prev);
    }
  }
  insert_free(start, length);
}

std::uint64_t ExtentAllocator::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}

std::uint64_t ExtentAllocator::largest_free() const {
  std::lock_guard lock(mutex_);
  return free_by_length_.empty() ? 0 : free_by_length_.rbegin()->first;
}

std::size_t ExtentAllocator::free_ranges() const {
  std::lock_guard lock(mutex_);
  return free_by_offset_.size();
}

}  // namespace teraio::io
