#include "bandwidth_ledger.hpp"

#include <algorithm>

#include "circular.hpp"

namespace teraio::plan::detail {
namespace {

constexpr std::size_t kD2h = 0;
constexpr std::size_t kH2d = 1;
constexpr std::size_t kSsdWrite = 2;
constexpr std::size_t kSsdRead = 3;
constexpr std::size_t kLink = 4;  // both PCIe directions together (Hardware::pcie_duplex_bandwidth)

}  // namespace

BandwidthLedger::BandwidthLedger(const std::vector<double>& durations, const Hardware& hardware)
    : n_(durations.size()) {
  const std::array<double, kChannelCount> bandwidth{hardware.d2h_bandwidth, hardware.h2d_bandwidth,
                                                    hardware.ssd_write_bandwidth, hardware.ssd_read_bandwidth,
                                                    hardware.shared_link_rate()};
  for (std::size_t c = 0; c < kChannelCount; ++c) {
    channel_free_[c].resize(n_);
    for (std::size_t k = 0; k < n_; ++k) channel_free_[c][k] = durations[k] * bandwidth[c];
  }
  route_channels_[index(Route::kOffloadHost)] = {kD2h};
  route_channels_[index(Route::kPrefetchHost)] = {kH2d};
  route_channels_[index(Route::kOffloadSsd)] =
      hardware.gpudirect ? std::vector<std::size_t>{kSsdWrite} : std::vector<std::size_t>{kSsdWrite, kD2h};
  route_channels_[index(Route::kPrefetchSsd)] =
      hardware.gpudirect ? std::vector<std::size_t>{kSsdRead} : std::vector<std::size_t>{kSsdRead, kH2d};
  // A shared link: what crosses PCIe either way during an operator also takes the link's room,
  // so an offload and a prefetch booked in the same operators cannot both run at full rate (the
  // H100 machines: 94 GB/s together against 55 GB/s each way). A shared rate below one
  // direction's own also caps that direction alone here, more cautiously than the simulator,
  // which slows a direction only while the other is busy.
  if (hardware.shared_link_rate() > 0) {
    for (auto& channels : route_channels_) {
      if (std::find(channels.begin(), channels.end(), kD2h) != channels.end() ||
          std::find(channels.begin(), channels.end(), kH2d) != channels.end())
        channels.push_back(kLink);
    }
  }
  route_free_.reserve(kRouteCount);
  for (std::size_t r = 0; r < kRouteCount; ++r) {
    double rate = bandwidth[route_channels_[r].front()];
    std::vector<double> free(n_, 0.0);
    for (std::size_t c : route_channels_[r]) {
      rate = std::min(rate, bandwidth[c]);
      channel_routes_[c].push_back(r);
    }
    rate_[r] = rate > 0 ? rate : 0;
    for (std::size_t k = 0; k < n_; ++k) {
      double f = channel_free_[route_channels_[r].front()][k];
      for (std::size_t c : route_channels_[r]) f = std::min(f, channel_free_[c][k]);
      free[k] = rate_[r] > 0 ? f : 0;
    }
    route_free_.emplace_back(free);
  }
}

std::size_t BandwidthLedger::earliest_finish(Route route, Window window, std::size_t limit,
                                             double bytes) const {
  const CapacityTree& tree = route_free_[index(route)];
  for (const Segment& seg : segments(n_, window, 0, limit)) {
    const std::size_t op = tree.walk_forward(seg.op_begin, seg.op_end, bytes);
    if (op != kNotFound) return seg.offset(op);
  }
  return kNotFound;
}

std::size_t BandwidthLedger::latest_start(Route route, Window window, std::size_t lo, double bytes) const {
  const CapacityTree& tree = route_free_[index(route)];
  const Segments segs = segments(n_, window, lo, window.length);
  for (std::size_t i = segs.count; i-- > 0;) {
    const Segment& seg = segs.items[i];
    const std::size_t op = tree.walk_backward(seg.op_begin, seg.op_end, bytes);
    if (op != kNotFound) return seg.offset(op);
  }
  return kNotFound;
}

void BandwidthLedger::take(Route route, std::size_t op, double bytes) {
  for (std::size_t c : route_channels_[index(route)]) {
    channel_free_[c][op] = std::max(0.0, channel_free_[c][op] - bytes);
    // Every route through this channel sees less room now (SSD bounce shares PCIe).
    for (std::size_t r : channel_routes_[c]) {
      if (rate_[r] <= 0) continue;
      double f = channel_free_[route_channels_[r].front()][op];
      for (std::size_t c2 : route_channels_[r]) f = std::min(f, channel_free_[c2][op]);
      if (f != route_free_[r].get(op)) route_free_[r].set(op, f);
    }
  }
}

void BandwidthLedger::book_forward(Route route, Window window, std::size_t last, double bytes) {
  const CapacityTree& tree = route_free_[index(route)];
  for (const Segment& seg : segments(n_, window, 0, last + 1)) {
    for (std::size_t op = tree.first_positive(seg.op_begin, seg.op_end); op != kNotFound && bytes > 0;
         op = tree.first_positive(op + 1, seg.op_end)) {
      const double taken = std::min(bytes, tree.get(op));
      take(route, op, taken);
      bytes -= taken;
    }
  }
}

void BandwidthLedger::book_backward(Route route, Window window, std::size_t first, double bytes) {
  const CapacityTree& tree = route_free_[index(route)];
  const Segments segs = segments(n_, window, first, window.length);
  for (std::size_t i = segs.count; i-- > 0;) {
    const Segment* it = &segs.items[i];
    for (std::size_t op = tree.last_positive(it->op_begin, it->op_end); op != kNotFound && bytes > 0;
         op = op == it->op_begin ? kNotFound : tree.last_positive(it->op_begin, op)) {
      const double taken = std::min(bytes, tree.get(op));
      take(route, op, taken);
      bytes -= taken;
    }
  }
}

}  // namespace teraio::plan::detail
