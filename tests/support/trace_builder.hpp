// Small hand-made traces for the trace and plan tests: operators named "op<k>" and tensors
// added one by one with explicit uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::testing {

inline trace::Trace trace_of_durations(const std::vector<double>& durations) {
  trace::Trace t;
  for (std::size_t k = 0; k < durations.size(); ++k)
    t.ops.push_back({"op" + std::to_string(k), durations[k], trace::Phase::kForward});
  return t;
}

// Appends tensor "t<index>" with the given id; suites pick their own id ranges so that ids
// never look like indices by accident.
inline trace::Tensor& append_tensor(trace::Trace& t, trace::TensorId id, std::uint64_t bytes,
                                    std::vector<trace::OpIndex> uses, bool persistent,
                                    trace::TensorKind kind) {
  trace::Tensor& x = t.tensors.emplace_back();
  x.id = id;
  x.bytes = bytes;
  x.kind = kind;
  x.persistent = persistent;
  x.name = "t" + std::to_string(t.tensors.size() - 1);
  x.uses = std::move(uses);
  return x;
}

}  // namespace teraio::testing
