// Small hand-made traces for the trace tests: operators with given durations and tensors
// with given uses, so expected lifetimes can be worked out by hand.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "support/trace_builder.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::trace::testing {

inline Trace make_trace(std::initializer_list<double> durations) {
  return teraio::testing::trace_of_durations(std::vector<double>(durations));
}

inline Tensor& add_tensor(Trace& t, std::uint64_t bytes, std::vector<OpIndex> uses, bool persistent = false,
                          TensorKind kind = TensorKind::kActivation) {
  return teraio::testing::append_tensor(t, 101 + t.tensors.size(), bytes, std::move(uses), persistent, kind);
}

}  // namespace teraio::trace::testing
