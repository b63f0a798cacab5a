// plan/hardware: the machine the planner plans for and the simulator replays on — the GPU
// memory budget, the capacities of the host and SSD tiers, and the bandwidths and latency of
// the migration channels. Without GPUDirect Storage, SSD traffic also crosses PCIe through
// host memory, so it occupies the PCIe channel of its direction too.
#pragma once

#include <cstdint>
#include <string>

namespace teraio::plan {

struct Hardware {
  std::uint64_t gpu_budget = 0;     // bytes of device memory tracked tensors may occupy
  std::uint64_t host_capacity = 0;  // pinned host tier cap; 0 disables the tier
  std::uint64_t ssd_capacity = 0;   // SSD tier capacity (all paths together); 0 disables it
  double d2h_bandwidth = 55e9;      // bytes/s, device to host (PCIe)
  double h2d_bandwidth = 55e9;      // bytes/s, host to device (PCIe)
  // bytes/s of both PCIe directions together while both are busy, shared in proportion to
  // their own rates (the H100 machines: 94e9 against 55e9 each way); 0: each at its own rate.
  // The simulator's channels use it (and so the planner's replays in its search for planned
  // waits), the step bound where forced returns and departures meet (plan/shared_link), and
  // the planner's booking: offloads and prefetches in the same operators share it.
  double pcie_duplex_bandwidth = 0;
  double ssd_write_bandwidth = 2.2e9;  // bytes/s, all SSD paths together
  double ssd_read_bandwidth = 1.7e9;   // bytes/s, all SSD paths together
  bool gpudirect = false;              // SSD traffic bypasses the PCIe/host channel
  double request_latency_s = 20e-6;    // fixed cost per migration request

  // pcie_duplex_bandwidth where it caps the two directions together (below their sum), else 0.
  double shared_link_rate() const {
    return pcie_duplex_bandwidth > 0 && pcie_duplex_bandwidth < d2h_bandwidth + h2d_bandwidth
               ? pcie_duplex_bandwidth
               : 0.0;
  }

  // One-line human description ("budget 24.0 GiB, host 64.0 GiB, ...").
  std::string describe() const;
};

}  // namespace teraio::plan
