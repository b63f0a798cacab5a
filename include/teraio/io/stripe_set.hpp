// io/stripe_set: where the bytes of an SSD extent live across N swap files. A range larger
// than the stripe unit is cut into stripe-unit pieces dealt round-robin over all paths (each
// path keeps its pieces in one contiguous reservation), so N SSDs serve it at about N times
// the bandwidth without RAID; a smaller range goes whole to the path with the most free space.
// Pure placement logic: the files and transfers belong to the tier store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "teraio/io/extent_allocator.hpp"

namespace teraio::io {

// Bytes [logical_offset, logical_offset + length) of the extent live at file_offset of path.
struct StripePiece {
  std::size_t path = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t logical_offset = 0;
  std::uint64_t length = 0;
};

struct StripeReservation {
  std::size_t path = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

struct StripeLayout {
  std::vector<StripePiece> pieces;  // in logical order
  std::vector<StripeReservation> reservations;
};

class StripeSet {
 public:
  // One capacity per path; stripe_unit must be a positive multiple of the page size.
  StripeSet(const std::vector<std::uint64_t>& capacities, std::uint64_t stripe_unit);

  // nullopt when the paths cannot hold the range ("tier full"); nothing is reserved then.
  std::optional<StripeLayout> allocate(std::uint64_t bytes);
  void release(const StripeLayout& layout);

  std::size_t paths() const { return allocators_.size(); }
  std::uint64_t stripe_unit() const { return stripe_unit_; }
  std::uint64_t capacity(std::size_t path) const { return allocators_[path]->capacity(); }
  std::uint64_t used(std::size_t path) const { return allocators_[path]->used(); }

 private:
  std::optional<StripeLayout> allocate_whole(std::uint64_t bytes);
  std::optional<StripeLayout> allocate_striped(std::uint64_t bytes);

  std::uint64_t stripe_unit_;
  std::vector<std::unique_ptr<ExtentAllocator>> allocators_;
  std::mutex mutex_;  // keeps multi-path reservations and the round-robin cursor consistent
  std::size_t next_start_ = 0;
};

}  // namespace teraio::io
