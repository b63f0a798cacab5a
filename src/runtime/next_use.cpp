#include "teraio/runtime/next_use.hpp"

#include <algorithm>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::runtime {

NextUses::NextUses(const trace::Trace& trace) : step_ops_(trace.ops.size()) {
  if (trace.step_begins.size() > 1) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("next uses are taken from one step; the trace has ", trace.step_begins.size()));
  }
  uses_.reserve(trace.tensors.size());
  for (const trace::Tensor& t : trace.tensors) {
    if (t.uses.empty()) continue;
    uses_[t.id] = Uses{t.uses, t.persistent};
    if (t.persistent) continue;
    const trace::OpIndex released = trace::release_op(t);
    if (released >= released_.size()) released_.resize(std::size_t{released} + 1);
    released_[released].push_back(t.id);
  }
}

std::span<const trace::TensorId> NextUses::released_at(trace::OpIndex k) const {
  if (k >= released_.size()) return {};
  return released_[k];
}

std::uint64_t NextUses::after(trace::TensorId id, trace::OpIndex k) const {
  const auto found = uses_.find(id);
  if (found == uses_.end()) return kNever;
  const std::vector<trace::OpIndex>& ops = found->second.ops;
  const auto next = std::upper_bound(ops.begin(), ops.end(), k);
  if (next != ops.end()) return *next;
  return found->second.persistent ? step_ops_ + ops.front() : std::uint64_t{k} + 1;
}

}  // namespace teraio::runtime
