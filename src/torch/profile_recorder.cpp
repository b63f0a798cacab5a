#include "profile_recorder.hpp"

#include <algorithm>
#include <iterator>

namespace teraio::torch_binding {

void ProfileRecorder::begin(bool record_writes) {
  record_writes_ = record_writes;
  ops_.clear();
  uses_.clear();
  order_.clear();
}

void ProfileRecorder::add_op(std::string name, trace::Phase phase) {
  trace::Operator op;
  op.name = std::move(name);
  op.phase = phase;
  ops_.push_back(std::move(op));
}

void ProfileRecorder::use(trace::TensorId id, trace::OpIndex k, std::uint64_t bytes) {
  auto [it, inserted] = uses_.try_emplace(id);
  if (inserted) order_.push_back(id);
  it->second.bytes = std::max(it->second.bytes, bytes);
  if (it->second.ops.empty() || it->second.ops.back() != k) it->second.ops.push_back(k);
}

void ProfileRecorder::write(trace::TensorId id, trace::OpIndex k) {
  if (!record_writes_) return;
  const auto it = uses_.find(id);
  if (it != uses_.end() && (it->second.writes.empty() || it->second.writes.back() != k))
    it->second.writes.push_back(k);
}

void ProfileRecorder::release(trace::TensorId id, trace::OpIndex k) {
  const auto it = uses_.find(id);
  if (it != uses_.end()) it->second.released_before = k;
}

trace::Trace ProfileRecorder::finish(const std::vector<double>& durations,
                                     const std::function<bool(trace::TensorId)>& persistent,
                                     const std::string& source) const {
  trace::Trace out;
  out.ops = ops_;
  for (std::size_t k = 0; k < out.ops.size() && k < durations.size(); ++k)
    out.ops[k].duration_s = durations[k];
  out.tensors.reserve(order_.size());
  for (const trace::TensorId id : order_) {
    const Uses& uses = uses_.at(id);
    trace::Tensor tensor;
    tensor.id = id;
    tensor.bytes = uses.bytes;
    tensor.persistent = persistent(id);
    tensor.kind = tensor.persistent ? trace::TensorKind::kOther : trace::TensorKind::kActivation;
    tensor.uses = uses.ops;
    // Uses arrive in operator order except when a storage is touched again by a later
    // operator of a different thread's sequence; sorting keeps the trace valid regardless.
    std::sort(tensor.uses.begin(), tensor.uses.end());
    tensor.uses.erase(std::unique(tensor.uses.begin(), tensor.uses.end()), tensor.uses.end());
    if (record_writes_) {
      std::vector<trace::OpIndex> writes = uses.writes;
      std::sort(writes.begin(), writes.end());
      std::set_difference(tensor.uses.begin(), tensor.uses.end(), writes.begin(), writes.end(),
                          std::back_inserter(tensor.read_only_uses));
    }
    if (uses.released_before && !tensor.persistent) {
      const trace::OpIndex end = std::min(*uses.released_before, static_cast<trace::OpIndex>(out.ops.size()));
      if (end > 0 && end - 1 > tensor.uses.back()) tensor.held_after_use = end - 1 - tensor.uses.back();
    }
    out.tensors.push_back(std::move(tensor));
  }
  out.source = source;
  return out;
}

}  // namespace teraio::torch_binding
