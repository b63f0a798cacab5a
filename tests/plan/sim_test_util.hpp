// Hand-made traces and plans for the simulator tests: unit-sized tensors (1e9 bytes),
// one-second operators and 1 GB/s channels, so that every expected time is worked out by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/trace_builder.hpp"
#include "teraio/plan/hardware.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan::simtest {

inline constexpr std::uint64_t kGB = 1000000000ULL;

inline trace::Trace unit_trace(std::size_t ops) {
  return teraio::testing::trace_of_durations(std::vector<double>(ops, 1.0));
}

// Returns the new tensor's id (1, 2, ...).
inline trace::TensorId add(trace::Trace& t, std::uint64_t bytes, std::vector<trace::OpIndex> uses,
                           bool persistent = false) {
  return teraio::testing::append_tensor(
             t, t.tensors.size() + 1, bytes, std::move(uses), persistent,
             persistent ? trace::TensorKind::kParameter : trace::TensorKind::kActivation)
      .id;
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
