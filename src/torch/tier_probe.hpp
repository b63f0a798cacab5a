// torch/tier_probe: a quick measurement of the tiers at session start-up, so the planner
// plans for this machine's bandwidths rather than for a guess.
#pragma once

#include <cstdint>

#include "teraio/io/tier_store.hpp"

namespace teraio::torch_binding {

// Bytes per second; 0 where the tier is absent or could not be measured.
struct TierBandwidths {
  double d2h = 0;  // device -> host tier
  double h2d = 0;  // host tier -> device
  double ssd_write = 0;
  double ssd_read = 0;
};

// Writes and reads `bytes` (clamped to what each tier has free) through each tier, once to wait
// for the tier to be ready and then 4 times, keeping the fastest of those per direction.
TierBandwidths probe_tiers(io::TierStore& store, io::DeviceCopier& copier, std::uint64_t bytes);

}  // namespace teraio::torch_binding
