// The planner's book of migration bandwidth: during operator k each channel (PCIe d2h, PCIe
// h2d, SSD write, SSD read) can carry duration[k] × bandwidth bytes; a migration takes that
// capacity operator by operator along its route. Without GPUDirect Storage an SSD transfer
// is bounced through host memory, so its route holds both the SSD channel and the PCIe
// channel of its direction. Where Hardware::pcie_duplex_bandwidth is below the two PCIe
// directions' sum, every route through PCIe also holds a fifth channel, the link, which carries
// duration[k] × that rate in both directions together. The step repeats, so windows are
// circular: a window starts at an operator and spans `length` operators, wrapping past the last
// one into the next step.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/plan/range_tree.hpp"

namespace teraio::plan::detail {

enum class Route : std::size_t { kOffloadHost, kOffloadSsd, kPrefetchHost, kPrefetchSsd };
inline constexpr std::size_t kRouteCount = 4;

// A circular window of operators [start, start + length) modulo the operator count;
// positions inside it are offsets 0 .. length-1.
struct Window {
  std::size_t start = 0;
  std::size_t length = 0;
};

class BandwidthLedger {
 public:
  BandwidthLedger(const std::vector<double>& durations, const Hardware& hardware);

  // Routes whose channels all have a positive bandwidth.
  bool usable(Route route) const { return rate_[index(route)] > 0; }
  // Bytes per second of the route (its slowest channel).
  double rate(Route route) const { return rate_[index(route)]; }

  // Smallest offset e in [0, limit) such that the route's free capacity over offsets [0, e]
  // covers `bytes`: a transfer issued at offset 0 is complete by the end of e. kNotFound if none.
  std::size_t earliest_finish(Route route, Window window, std::size_t limit, double bytes) const;
  // Largest offset p in [lo, window.length) such that the free capacity over offsets
  // [p, length) covers `bytes`: the latest issue that still completes by the window's end.
  std::size_t latest_start(Route route, Window window, std::size_t lo, double bytes) const;

  // Take `bytes` of the route's capacity, forward from offset 0 through offset `last`.
  void book_forward(Route route, Window window, std::size_t last, double bytes);
  // Take `bytes` of the route's capacity, backward from the window's end down to offset `first`.
  void book_backward(Route route, Window window, std::size_t first, double bytes);

 private:
  static std::size_t index(Route route) { return static_cast<std::size_t>(route); }
  void take(Route route, std::size_t op, double bytes);

  std::size_t n_ = 0;
  static constexpr std::size_t kChannelCount = 5;
  std::array<double, kRouteCount> rate_{};
  // Free bytes per channel and operator (d2h, h2d, SSD write, SSD read, the shared link).
  std::array<std::vector<double>, kChannelCount> channel_free_;
  // The channels each route holds, and the routes each channel serves.
  std::array<std::vector<std::size_t>, kRouteCount> route_channels_;
  std::array<std::vector<std::size_t>, kChannelCount> channel_routes_;
  // Per route: free bytes = min over its channels, in a tree for O(log n) walks.
  std::vector<CapacityTree> route_free_;
};

}  // namespace teraio::plan::detail
