#include "teraio/io/host_tier.hpp"

#include "teraio/core/units.hpp"

namespace teraio::io {

HostTier::HostTier(DeviceCopier& copier, std::uint64_t capacity, bool pin_in_background)
    : region_(capacity > 0 ? std::make_unique<PinnedRegion>(copier, capacity, false) : nullptr),
      allocator_(align_down(capacity, kPageSize)) {
  if (!region_) {
    std::promise<void> done;
    done.set_value();
    pinned_ = done.get_future().share();
    return;
  }
  PinnedRegion* region = region_.get();
  pinned_ = std::async(pin_in_background ? std::launch::async : std::launch::deferred, [region] {
              region->pin();
            }).share();
  if (!pin_in_background) pinned_.get();
}

HostTier::~HostTier() {
  // A background pin may still touch the region: let it finish before unmapping.
  if (pinned_.valid()) pinned_.wait();
}

void HostTier::wait_pinned() {
  pinned_.get();
}

}  // namespace teraio::io
