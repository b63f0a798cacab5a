// The simulator's migration channels (internal to plan/): requests in flight, the four
// channel servers, and the order in which they serve requests. See plan/simulator.hpp for
// the model; this part knows nothing of tensors' states or memory.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <queue>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/plan/simulator.hpp"

namespace teraio::plan::detail {

inline constexpr double kNever = std::numeric_limits<double>::infinity();
inline constexpr std::uint32_t kNoMigration = std::numeric_limits<std::uint32_t>::max();

// One transfer: a planned migration in one step, a demand fetch or an eviction.
struct Request {
  std::uint32_t migration = kNoMigration;
  std::uint32_t tensor = 0;
  std::uint64_t bytes = 0;
  bool offload = false;
  bool urgent = false;
  bool cancelled = false;  // an offload overtaken by the tensor's prefetch: the data never left
  Tier tier = Tier::kHost;
  std::uint64_t deadline = 0;  // global operator index
  std::uint64_t seq = 0;
  // The channels the transfer occupies. Without GDS an SSD transfer bounces through host
  // memory in chunks, so its PCIe and SSD legs run at the same time (pipelined): each leg is
  // served on its own channel and the transfer completes when both have.
  std::array<Channel, 2> legs{};
  std::uint8_t leg_count = 1;
  std::uint8_t legs_done = 0;
  double arrival = 0;                         // issue time
  std::array<double, 2> remaining_s{-1, -1};  // service left per leg; negative before it starts
  double legs_end = 0;                        // latest completion among finished legs
  double end = kNever;                        // completion of the whole transfer, once scheduled
};

// Time a channel spends on one request (consecutive slices merged).
struct Busy {
  double start, end;
  double bytes;
  std::uint32_t migration;
  std::uint32_t request;
  bool first;  // the request's first slice on this channel
};

// Bytes per second of the slowest channel a transfer to or from `tier` occupies (see Request::legs);
// 0 when that route cannot carry anything.
inline double route_bandwidth(const Hardware& hw, Tier tier, bool offload) {
  const double pcie = offload ? hw.d2h_bandwidth : hw.h2d_bandwidth;
  const double disk = offload ? hw.ssd_write_bandwidth : hw.ssd_read_bandwidth;
  const double rate = tier == Tier::kHost ? pcie : hw.gpudirect ? disk : std::min(disk, pcie);
  return rate > 0 ? rate : 0;
}

class Channels {
 public:
  explicit Channels(const Hardware& hw);

  // Queues a transfer issued at `now` on its route's first channel; returns its id.
  std::uint32_t submit(Request r, double now);
  Request& request(std::uint32_t id) { return requests_[id]; }
  const Request& request(std::uint32_t id) const { return requests_[id]; }

  // Schedules every slice that starts before `until`; says whether there was any.
  bool advance(double until);
  // Schedules one slice (however late); false when nothing is queued anywhere.
  bool schedule_one() { return schedule_next(kNever); }
  // The earliest time request `id` could complete if served at once from now on: a bound
  // that advancing to never overshoots the moment it really completes.
  double completion_bound(std::uint32_t id) const;
  // The next completed request (all legs) at or before `until`, in time order, or kNoRequest.
  static constexpr std::uint32_t kNoRequest = std::numeric_limits<std::uint32_t>::max();
  std::uint32_t pop_completed(double until);

  const std::vector<Busy>& busy(std::size_t channel) const { return busy_[channel]; }

 private:
  struct LaterArrival {
    const std::vector<Request>* r;
    bool operator()(std::uint32_t a, std::uint32_t b) const { return (*r)[a].arrival > (*r)[b].arrival; }
  };
  struct LowerPriority {
    const std::vector<Request>* r;
    bool operator()(std::uint32_t a, std::uint32_t b) const;
  };
  struct EarlierEnd {
    const std::vector<Request>* r;
    bool operator()(std::uint32_t a, std::uint32_t b) const { return (*r)[a].end > (*r)[b].end; }
  };
  struct Server {
    explicit Server(const std::vector<Request>* r) : future(LaterArrival{r}), ready(LowerPriority{r}) {}
    double free_at = 0;
    std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, LaterArrival> future;
    std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, LowerPriority> ready;
  };

  double next_start(const Server& s) const;
  double leg_time(const Request& r, std::size_t channel) const;
  double stretch(std::size_t channel, double start) const;
  static std::size_t leg_of(const Request& r, std::size_t channel);
  bool schedule_next(double limit);

  const Hardware& hw_;
  std::array<double, kChannelCount> bandwidth_{};
  std::vector<Request> requests_;
  std::array<Server, kChannelCount> servers_{Server(&requests_), Server(&requests_), Server(&requests_),
                                             Server(&requests_)};
  std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, EarlierEnd> completions_{
      EarlierEnd{&requests_}};
  std::array<std::vector<Busy>, kChannelCount> busy_;
};

}  // namespace teraio::plan::detail
