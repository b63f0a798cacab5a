// Hand-made traces and plans for the simulator tests: unit-sized tensors (1e9 bytes),
// one-second operators and 1 GB/s channels, so that every expected time is worked out by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan::simtest {

inline constexpr std::uint64_t kGB = 1000000000ULL;

inline trace::Trace unit_trace(std::size_t ops) {
  trace::Trace t;
  for (std::size_t k = 0; k < ops; ++k)
    t.ops.push_back({"op" + std::to_string(k), 1.0, trace::Phase::kForward});
  return t;
}

// Returns the new tensor's id (1, 2, ...).
inline trace::TensorId add(trace::Trace& t, std::uint64_t bytes, std::vector<trace::OpIndex> uses,
                           bool persistent = false) {
  trace::Tensor& x = t.tensors.emplace_back();
  x.id = t.tensors.size();
  x.bytes = bytes;
  x.kind = persistent ? trace::TensorKind::kParameter : trace::TensorKind::kActivation;
  x.persistent = persistent;
  x.name = "t" + std::to_string(x.id);
  x.uses = std::move(uses);
  return x.id;
}

inline Hardware unit_hardware(std::uint64_t budget = 100 * kGB) {
  Hardware hw;
  hw.gpu_budget = budget;
  hw.host_capacity = 100 * kGB;
  hw.ssd_capacity = 100 * kGB;
  hw.d2h_bandwidth = hw.h2d_bandwidth = hw.ssd_write_bandwidth = hw.ssd_read_bandwidth = 1e9;
  hw.gpudirect = false;
  hw.request_latency_s = 0;
  return hw;
}

inline Migration offload(trace::TensorId id, std::uint64_t bytes, trace::OpIndex issue,
                         trace::OpIndex deadline, Tier tier = Tier::kHost, bool urgent = false) {
  return {id, bytes, Direction::kOffload, tier, issue, deadline, urgent};
}

inline Migration prefetch(trace::TensorId id, std::uint64_t bytes, trace::OpIndex issue,
                          trace::OpIndex deadline, Tier tier = Tier::kHost, bool urgent = false) {
  return {id, bytes, Direction::kPrefetch, tier, issue, deadline, urgent};
}

}  // namespace teraio::plan::simtest
