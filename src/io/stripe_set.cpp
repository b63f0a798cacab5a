#include "teraio/io/stripe_set.hpp"

#include <algorithm>
#include <numeric>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {

StripeSet::StripeSet(const std::vector<std::uint64_t>& capacities, std::uint64_t stripe_unit)
    : stripe_unit_(stripe_unit) {
  if (stripe_unit == 0 || !is_aligned(stripe_unit, kPageSize)) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("stripe unit ", stripe_unit, " must be a positive multiple of ", kPageSize, " bytes"));
  }
  for (std::uint64_t capacity : capacities)
    allocators_.push_back(std::make_unique<ExtentAllocator>(capacity));
}

std::optional<StripeLayout> StripeSet::allocate(std::uint64_t bytes) {
  if (allocators_.empty()) return std::nullopt;
  std::uint64_t total = 0;
  for (const auto& allocator : allocators_) total += allocator->capacity();
  // Also keeps the piece arithmetic below far from overflow.
  if (bytes > total) return std::nullopt;
  std::lock_guard lock(mutex_);
  if (bytes <= stripe_unit_ || allocators_.size() == 1) return allocate_whole(bytes);
  return allocate_striped(bytes);
}

std::optional<StripeLayout> StripeSet::allocate_whole(std::uint64_t bytes) {
  // Most free space first, for balance; but free space may be fragmented, so a path that
  // cannot hold the range contiguously hands it on to the next one instead of failing it.
  // Free space read once: releases run concurrently, and sorting on changing keys is undefined.
  std::vector<std::uint64_t> free(allocators_.size());
  for (std::size_t p = 0; p < free.size(); ++p) free[p] = allocators_[p]->capacity() - allocators_[p]->used();
  std::vector<std::size_t> order(allocators_.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return free[a] > free[b]; });
  std::size_t best = 0;
  std::optional<std::uint64_t> offset;
  for (const std::size_t p : order) {
    offset = allocators_[p]->allocate(bytes);
    if (offset) {
      best = p;
      break;
    }
  }
  if (!offset) return std::nullopt;
  StripeLayout layout;
  layout.reservations.push_back({best, *offset, bytes});
  // Pieces of at most one stripe unit keep the transfer pipeline's chunks bounded.
  for (std::uint64_t at = 0; at < bytes; at += stripe_unit_) {
    layout.pieces.push_back({best, *offset + at, at, std::min(stripe_unit_, bytes - at)});
  }
  return layout;
}

std::optional<StripeLayout> StripeSet::allocate_striped(std::uint64_t bytes) {
  const std::size_t n = allocators_.size();
  const std::uint64_t count = (bytes + stripe_unit_ - 1) / stripe_unit_;
  const std::size_t start = next_start_;
  std::vector<std::uint64_t> per_path(n, 0);
  for (std::uint64_t i = 0; i < count; ++i) {
    per_path[(start + i) % n] += std::min(stripe_unit_, bytes - i * stripe_unit_);
  }
  StripeLayout layout;
  std::vector<std::uint64_t> base(n, 0);
  for (std::size_t p = 0; p < n; ++p) {
    if (per_path[p] == 0) continue;
    auto offset = allocators_[p]->allocate(per_path[p]);
    if (!offset) {
      for (const auto& r : layout.reservations) allocators_[r.path]->release(r.offset, r.bytes);
      return std::nullopt;
    }
    base[p] = *offset;
    layout.reservations.push_back({p, *offset, per_path[p]});
  }
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::size_t p = (start + i) % n;
    const std::uint64_t slot = i / n;
    layout.pieces.push_back({p, base[p] + slot * stripe_unit_, i * stripe_unit_,
                             std::min(stripe_unit_, bytes - i * stripe_unit_)});
  }
  next_start_ = (start + 1) % n;
  return layout;
}

void StripeSet::release(const StripeLayout& layout) {
  for (const auto& r : layout.reservations) allocators_[r.path]->release(r.offset, r.bytes);
}

}  // namespace teraio::io
