// io/host_tier: pinned host memory holding offloaded tensors. One arena of a hard capacity is
// mapped and pinned once (pinning 32 GiB takes ~14 s on the GPU machines, so it may run in
// the background) and then only carved up and reused: the tier never grows and never
// exceeds its capacity; a request that does not fit gets nullopt ("tier full").
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "teraio/io/device_copy.hpp"
#include "teraio/io/extent_allocator.hpp"
#include "teraio/io/pinned_pool.hpp"

namespace teraio::io {

class HostTier {
 public:
  // capacity 0 makes an empty tier that refuses every allocation.
  HostTier(DeviceCopier& copier, std::uint64_t capacity, bool pin_in_background);
  // Waits for a background pin still running.
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  std::optional<std::uint64_t> allocate(std::uint64_t bytes) { return allocator_.allocate(bytes); }
  void release(std::uint64_t offset, std::uint64_t bytes) { allocator_.release(offset, bytes); }
  // Address of an allocated offset. Copies must call wait_pinned() first.
  std::byte* data(std::uint64_t offset) const { return region_->data() + offset; }
  // Blocks until the arena is pinned; rethrows a pinning failure.
  void wait_pinned();

  std::uint64_t capacity() const { return allocator_.capacity(); }
  std::uint64_t used() const { return allocator_.used(); }
  const ExtentAllocator& allocator() const { return allocator_; }
  // Where the arena's pages are (PinnedRegion::numa); empty for an empty tier.
  std::string numa() const { return region_ ? region_->numa() : std::string(); }

 private:
  std::unique_ptr<PinnedRegion> region_;
  ExtentAllocator allocator_;
  std::shared_future<void> pinned_;
};

}  // namespace teraio::io
