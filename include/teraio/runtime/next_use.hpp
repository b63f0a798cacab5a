// runtime/next_use: when each tensor is used next in a planned step, from the profiled trace.
// Reactive eviction in planned mode takes the idle tensor used furthest ahead, as the simulator
// does, instead of the least recently used one: a tensor the plan has just brought back for an
// operator soon (AdamW state before the optimizer) was used least recently of all, so LRU would
// evict it first and fetch it again on demand.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <unordered_map>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::runtime {

class NextUses {
 public:
  // after() of a tensor no operator of the step or the next will use.
  static constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

  NextUses() = default;
  // From a single-step trace (the profile); Error{kInvalidArgument} for a multi-step one.
  explicit NextUses(const trace::Trace& trace);

  bool empty() const { return uses_.empty(); }
  // The operator at which tensor `id` is used next after operator k of the step. A persistent
  // tensor's first use in the next step counts as step length + its index there. A tensor the
  // trace does not know is kNever, so it goes first: in a step that follows the profile, a
  // tracked storage the profiled step never used (an earlier step's, a frozen copy) is not used
  // now either (a new storage the profile lacks makes the step divergent, and divergent steps
  // evict least recently used). A step-local tensor used no more counts as used at k + 1, so
  // that it goes last: the program frees it soon, so copying it out moves bytes about to be
  // dropped (measured on W2 at 24 GiB: 15 GiB per step that never came back; the simulator,
  // which frees it at its last use, never evicts it).
  std::uint64_t after(trace::TensorId id, trace::OpIndex k) const;

  // The first operator of the step that uses tensor `id`; kNever for a tensor the trace does
  // not know.
  std::uint64_t first(trace::TensorId id) const {
    const auto found = uses_.find(id);
    return found == uses_.end() || found->second.ops.empty() ? kNever : found->second.ops.front();
  }

  // Whether the trace has tensor `id` alive across steps (trace::Tensor::persistent); false for
  // a tensor it does not know.
  bool persistent(trace::TensorId id) const {
    const auto found = uses_.find(id);
    return found != uses_.end() && found->second.persistent;
  }

  // The step-local tensors the profiled step had freed by the end of operator k
  // (trace::release_op): from then on the program is expected to have let them go.
  std::span<const trace::TensorId> released_at(trace::OpIndex k) const;

 private:
  struct Uses {
    std::vector<trace::OpIndex> ops;  // sorted
    bool persistent = false;
  };
  std::unordered_map<trace::TensorId, Uses> uses_;
  std::vector<std::vector<trace::TensorId>> released_;  // by operator
  std::uint64_t step_ops_ = 0;
};

}  // namespace teraio::runtime
