#include "teraio/trace/trace.hpp"
#include <algorithm>

#include <unordered_set>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::trace {

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kOther: return "other";
  }
  return "other";
}

std::string_view to_string(TensorKind kind) {
  switch (kind) {
    case TensorKind::kParameter: return "parameter";
    case TensorKind::kGradient: return "gradient";
    case TensorKind::kOptimizerState: return "optimizer_state";
    case TensorKind::kActivation: return "activation";
    case TensorKind::kTemporary: return "temporary";
    case TensorKind::kOther: return "other";
  }
  return "other";
}

Phase parse_phase(std::string_view name) {
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer, Phase::kOther})
    if (to_string(p) == name) return p;
  throw Error(ErrorKind::kFormat, cat("unknown phase '", name, "' (forward, backward, optimizer, other)"));
}

TensorKind parse_tensor_kind(std::string_view name) {
  for (TensorKind k : {TensorKind::kParameter, TensorKind::kGradient, TensorKind::kOptimizerState,
                       TensorKind::kActivation, TensorKind::kTemporary, TensorKind::kOther})
    if (to_string(k) == name) return k;
  throw Error(ErrorKind::kFormat,
              cat("unknown tensor kind '", name,
                  "' (parameter, gradient, optimizer_state, activation, temporary, other)"));
}

void validate(const Trace& trace) {
  const std::size_t n = trace.ops.size();
  for (std::size_t k = 0; k < n; ++k) {
    if (trace.ops[k].name.size() > kMaxOperatorName)
      throw Error(ErrorKind::kFormat, cat("operator ", k, " has a name of ", trace.ops[k].name.size(),
                                          " bytes (limit ", kMaxOperatorName, ")"));
    const double d = trace.ops[k].duration_s;
    if (!(d >= 0) || d > 1e9)
      throw Error(ErrorKind::kFormat,
                  cat("operator ", k, " (", trace.ops[k].name, ") has an invalid duration ", d));
  }
  if (trace.step_begins.empty() || trace.step_begins.front() != 0)
    throw Error(ErrorKind::kFormat, "step_begins must start with operator 0");
  for (std::size_t s = 1; s < trace.step_begins.size(); ++s)
    if (trace.step_begins[s] <= trace.step_begins[s - 1] || trace.step_begins[s] >= n)
      throw Error(ErrorKind::kFormat, cat("step_begins[", s, "] = ", trace.step_begins[s],
                                          " is not increasing within ", n, " operators"));
  std::unordered_set<TensorId> ids;
  ids.reserve(trace.tensors.size());
  for (std::size_t i = 0; i < trace.tensors.size(); ++i) {
    const Tensor& t = trace.tensors[i];
    if (!ids.insert(t.id).second) throw Error(ErrorKind::kFormat, cat("tensor ", t.id, " appears twice"));
    if (t.uses.empty()) throw Error(ErrorKind::kFormat, cat("tensor ", t.id, " has no use"));
    for (std::size_t u = 0; u < t.uses.size(); ++u) {
      if (t.uses[u] >= n)
        throw Error(ErrorKind::kFormat, cat("tensor ", t.id, " use ", u, " points to operator ", t.uses[u],
                                            " past the last operator ", n == 0 ? 0 : n - 1));
      if (u > 0 && t.uses[u] <= t.uses[u - 1])
        throw Error(ErrorKind::kFormat,
                    cat("tensor ", t.id, " uses are not sorted and unique at position ", u));
    }
    if (t.held_after_use >= n - t.uses.back())
      throw Error(ErrorKind::kFormat,
                  cat("tensor ", t.id, " is held ", t.held_after_use, " operators after its last use ",
                      t.uses.back(), ", past the last operator ", n - 1));
    for (std::size_t r = 0; r < t.read_only_uses.size(); ++r) {
      if (r > 0 && t.read_only_uses[r] <= t.read_only_uses[r - 1])
        throw Error(ErrorKind::kFormat,
                    cat("tensor ", t.id, " read-only uses are not sorted and unique at position ", r));
      if (!std::binary_search(t.uses.begin(), t.uses.end(), t.read_only_uses[r]))
        throw Error(ErrorKind::kFormat, cat("tensor ", t.id, " has a read-only use at operator ",
                                            t.read_only_uses[r], ", which is not one of its uses"));
    }
  }
}

bool only_reads(const Tensor& t, OpIndex op) {
  return std::binary_search(t.read_only_uses.begin(), t.read_only_uses.end(), op);
}

}  // namespace teraio::trace
