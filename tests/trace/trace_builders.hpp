// Small hand-made traces for the trace tests: operators with given durations and tensors
// with given uses, so expected lifetimes can be worked out by hand.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::trace::testing {

inline Trace make_trace(std::initializer_list<double> durations) {
  Trace t;
  int k = 0;
  for (double d : durations) t.ops.push_back({"op" + std::to_string(k++), d, Phase::kForward});
  return t;
}

inline Tensor& add_tensor(Trace& t, std::uint64_t bytes, std::vector<OpIndex> uses, bool persistent = false,
                          TensorKind kind = TensorKind::kActivation) {
  Tensor& tensor = t.tensors.emplace_back();
  tensor.id = 100 + t.tensors.size();
  tensor.bytes = bytes;
  tensor.kind = kind;
  tensor.persistent = persistent;
  tensor.name = "t" + std::to_string(t.tensors.size() - 1);
  tensor.uses = std::move(uses);
  return tensor;
}

}  // namespace teraio::trace::testing
