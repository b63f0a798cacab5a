// torch/profile_recorder: turns what the observer saw during one profiled step into a
// lifetime trace (trace::Trace): the operator sequence with phases and durations, and for
// every storage its size, the operators that used it and when the program freed it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::torch_binding {

class ProfileRecorder {
 public:
  // Starts a step; with `record_writes` the trace says which uses only read each tensor
  // (trace::Tensor::read_only_uses), else it leaves them out (every use may write).
  void begin(bool record_writes);
  void add_op(std::string name, trace::Phase phase);
  std::size_t ops() const { return ops_.size(); }
  const std::string& op_name(trace::OpIndex k) const { return ops_[k].name; }
  // Tensor `id` of `bytes` was used by operator k (repeats are merged).
  void use(trace::TensorId id, trace::OpIndex k, std::uint64_t bytes);
  // Operator k (one of the tensor's uses) may change its bytes; every other use only reads.
  // Ignored unless begin() was asked to record writes.
  void write(trace::TensorId id, trace::OpIndex k);
  // Tensor `id` was freed before operator k began (k = the step's operator count: at or after
  // its end). A tensor never released counts as freed at its last use.
  void release(trace::TensorId id, trace::OpIndex k);
  // The step as a trace. persistent(id) says whether the storage lives across steps.
  trace::Trace finish(const std::vector<double>& durations,
                      const std::function<bool(trace::TensorId)>& persistent,
                      const std::string& source) const;

 private:
  struct Uses {
    std::uint64_t bytes = 0;
    std::vector<trace::OpIndex> ops;
    std::vector<trace::OpIndex> writes;
    std::optional<trace::OpIndex> released_before;
  };
  bool record_writes_ = false;
  std::vector<trace::Operator> ops_;
  std::unordered_map<trace::TensorId, Uses> uses_;
  std::vector<trace::TensorId> order_;  // first use order, for a deterministic trace
};

}  // namespace teraio::torch_binding
