#include "simulator_channels.hpp"

#include <algorithm>

namespace teraio::plan::detail {

Channels::Channels(const Hardware& hw) : hw_(hw) {
  bandwidth_ = {hw.d2h_bandwidth, hw.h2d_bandwidth, hw.ssd_write_bandwidth, hw.ssd_read_bandwidth};
}

bool Channels::LowerPriority::operator()(std::uint32_t a, std::uint32_t b) const {
  const Request& x = (*r)[a];
  const Request& y = (*r)[b];
  if (x.urgent != y.urgent) return y.urgent;
  if (x.deadline != y.deadline) return x.deadline > y.deadline;
  return x.seq > y.seq;
}

std::uint32_t Channels::submit(Request r, double now) {
  r.seq = requests_.size();
  r.arrival = now;
  const Channel pcie = r.offload ? Channel::kD2h : Channel::kH2d;
  const Channel disk = r.offload ? Channel::kSsdWrite : Channel::kSsdRead;
  if (r.tier == Tier::kHost) {
    r.legs[0] = pcie;
  } else if (hw_.gpudirect) {
    r.legs[0] = disk;
  } else {
    r.legs = {disk, pcie};
    r.leg_count = 2;
  }
  const auto id = static_cast<std::uint32_t>(requests_.size());
  requests_.push_back(r);
  for (std::size_t l = 0; l < r.leg_count; ++l) servers_[static_cast<std::size_t>(r.legs[l])].future.push(id);
  return id;
}

std::size_t Channels::leg_of(const Request& r, std::size_t channel) {
  return static_cast<std::size_t>(r.legs[0]) == channel ? 0 : 1;
}

double Channels::leg_time(const Request& r, std::size_t channel) const {
  // The per-request latency is paid once, by the first leg (the SSD's when there are two).
  return (leg_of(r, channel) == 0 ? hw_.request_latency_s : 0.0) + double(r.bytes) / bandwidth_[channel];
}

// How much longer than at its own rate a slice starting at `start` on `channel` takes: with
// both PCIe directions busy, the link gives them pcie_duplex_bandwidth together. A slice is
// stretched when the other direction is busy as it starts; one already running keeps its rate
// to its end (at the latest the next operator boundary), so an overlap that begins mid-slice
// is charged to the later slice alone.
double Channels::stretch(std::size_t channel, double start) const {
  const auto d2h = static_cast<std::size_t>(Channel::kD2h);
  const auto h2d = static_cast<std::size_t>(Channel::kH2d);
  if (hw_.pcie_duplex_bandwidth <= 0 || (channel != d2h && channel != h2d)) return 1.0;
  const std::size_t other = channel == d2h ? h2d : d2h;
  const Server& s = servers_[other];
  if (s.free_at <= start && next_start(s) > start) return 1.0;
  const double both = bandwidth_[channel] + bandwidth_[other];
  return both > hw_.pcie_duplex_bandwidth ? both / hw_.pcie_duplex_bandwidth : 1.0;
}

double Channels::next_start(const Server& s) const {
  if (!s.ready.empty()) return s.free_at;
  if (!s.future.empty()) return std::max(s.free_at, requests_[s.future.top()].arrival);
  return kNever;
}

bool Channels::schedule_next(double limit) {
  std::size_t best = kChannelCount;
  double start = limit;
  for (std::size_t c = 0; c < kChannelCount; ++c) {
    const double s = next_start(servers_[c]);
    if (s < start) {
      start = s;
      best = c;
    }
  }
  if (best == kChannelCount) return false;
  Server& server = servers_[best];
  while (!server.future.empty() && requests_[server.future.top()].arrival <= start) {
    server.ready.push(server.future.top());
    server.future.pop();
  }
  const std::uint32_t id = server.ready.top();
  server.ready.pop();
  Request& r = requests_[id];
  const std::size_t leg = leg_of(r, best);
  const double leg_s = leg_time(r, best);
  const bool first_slice = r.remaining_s[leg] < 0;
  if (first_slice) r.remaining_s[leg] = leg_s;
  const double factor = stretch(best, start);
  const double end = start + r.remaining_s[leg] * factor;
  // Transfers move in chunks, so a more urgent request issued at the next operator boundary
  // takes the channel over: the running one is served only up to `limit`, then competes again.
  const double slice_end = std::min(end, limit);
  const double served = (slice_end - start) / factor;  // service time at the channel's own rate
  const double bytes = leg_s > 0 ? double(r.bytes) * served / leg_s : double(r.bytes);
  server.free_at = slice_end;
  auto& spans = busy_[best];
  if (!spans.empty() && spans.back().request == id && spans.back().end == start) {
    spans.back().end = slice_end;
    spans.back().bytes += bytes;
  } else {
    spans.push_back({start, slice_end, bytes, r.migration, id, first_slice});
  }
  if (end > limit) {
    // Unstretched, the same arithmetic as without a shared cap, so results stay bit for bit.
    r.remaining_s[leg] = factor == 1.0 ? end - limit : r.remaining_s[leg] - served;
    server.ready.push(id);
    return true;
  }
  r.remaining_s[leg] = 0;
  r.legs_end = std::max(r.legs_end, end);
  if (++r.legs_done == r.leg_count) {
    r.end = r.legs_end;
    completions_.push(id);
  }
  return true;
}

bool Channels::advance(double until) {
  bool any = false;
  while (schedule_next(until)) any = true;
  return any;
}

double Channels::completion_bound(std::uint32_t id) const {
  const Request& r = requests_[id];
  if (r.end != kNever) return r.end;
  double bound = r.legs_end;
  for (std::size_t l = 0; l < r.leg_count; ++l) {
    if (r.remaining_s[l] == 0) continue;  // this leg is done
    const auto c = static_cast<std::size_t>(r.legs[l]);
    const double left = r.remaining_s[l] > 0 ? r.remaining_s[l] : leg_time(r, c);
    bound = std::max(bound, std::max(servers_[c].free_at, r.arrival) + left);
  }
  return bound;
}

std::uint32_t Channels::pop_completed(double until) {
  if (completions_.empty() || requests_[completions_.top()].end > until) return kNoRequest;
  const std::uint32_t id = completions_.top();
  completions_.pop();
  return id;
}

}  // namespace teraio::plan::detail
