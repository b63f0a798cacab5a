// trace/trace: the lifetime trace of one or more training steps — the operator sequence
// with measured durations and phases, the tensors with sizes and kinds, and for every tensor
// the operators that use it. It is what the profiler records and what the planner and
// simulator consume; it knows nothing of PyTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace teraio::trace {

// Position of an operator in the trace's operator sequence (0-based).
using OpIndex = std::uint32_t;
// Identity of a tensor that is stable across steps (assigned by the profiler or generator).
using TensorId = std::uint64_t;

enum class Phase : std::uint8_t { kForward, kBackward, kOptimizer, kOther };
enum class TensorKind : std::uint8_t {
  kParameter,
  kGradient,
  kOptimizerState,
  kActivation,
  kTemporary,
  kOther,
};

std::string_view to_string(Phase phase);
std::string_view to_string(TensorKind kind);
// Inverse of to_string; throw Error{kFormat} for unknown names.
Phase parse_phase(std::string_view name);
TensorKind parse_tensor_kind(std::string_view name);

struct Operator {
  std::string name;       // e.g. "aten::mm"
  double duration_s = 0;  // measured (or modelled) execution time, excluding migration waits
  Phase phase = Phase::kOther;

  bool operator==(const Operator&) const = default;
};

struct Tensor {
  TensorId id = 0;
  std::uint64_t bytes = 0;
  TensorKind kind = TensorKind::kOther;
  // Persistent tensors (weights, gradients kept across steps, optimizer states) live across
  // the step boundary: their last inactive period wraps into the next step. Others live from
  // their first use to their last use within the trace.
  bool persistent = false;
  std::string name;           // optional, for humans ("layers.3.mlp.up_proj.weight")
  std::vector<OpIndex> uses;  // operators that read or write it: sorted, unique
  // Step-local tensors: how many operators after its last use the program still holds its
  // memory (a Python variable not yet reassigned, a list not yet cleared). Planning as if it
  // were freed at its last use would leave the step over its budget by those bytes.
  std::uint32_t held_after_use = 0;
  // The uses that only read its bytes (a subset of uses, sorted). Any other use may change
  // them. A copy of the tensor made off the device stays valid across read-only uses, so a
  // later move out can drop the device memory instead of copying it again. Empty (traces
  // without this record): every use may write.
  std::vector<OpIndex> read_only_uses;

  bool operator==(const Tensor&) const = default;
};

// Whether use `op` of t (one of t.uses) only reads it.
bool only_reads(const Tensor& t, OpIndex op);

// The last operator during which tensor t holds device memory (step-local tensors).
inline OpIndex release_op(const Tensor& t) {
  return t.uses.back() + t.held_after_use;
}

struct Trace {
  std::vector<Operator> ops;
  std::vector<Tensor> tensors;
  // Index of the first operator of each step; {0} for a single-step trace. Sorted, starts at 0.
  std::vector<OpIndex> step_begins{0};
  // Device memory that exists outside the tracked tensors (context, workspaces, allocator
  // slack); counted in every operator's memory demand, never movable.
  std::uint64_t untracked_bytes = 0;
  // Free-form description: model, device, source ("profiled", "synthetic").
  std::string source;

  bool operator==(const Trace&) const = default;
};

// Longest operator name a trace may hold. Real names are short ("aten::mm"); the binary form
// interns names, so without a limit a few hostile bytes could expand into gigabytes.
inline constexpr std::size_t kMaxOperatorName = 1024;

// Checks the invariants above, that every use names an existing operator and that operator
// names fit kMaxOperatorName; throws Error{kFormat} naming the tensor or operator that breaks one.
void validate(const Trace& trace);

// Trace files (docs/trace-format.md): JSON for interchange and a compact little-endian
// binary form ("TIOTRACE") that loads a 250k-operator trace several times faster.
enum class TraceFormat { kJson, kBinary };

// kJson for a path ending in ".json", kBinary otherwise (".tiotrace" by convention).
TraceFormat trace_format_for_path(const std::string& path);

// Parse a whole file held in memory and validate it. Malformed or inconsistent input throws
// Error{kFormat} saying where (byte offset, section, operator index, tensor id) and why.
Trace parse_trace_json(std::string_view text);
Trace parse_trace_binary(std::span<const std::byte> data);
// Serialize a trace; both forms round-trip exactly (doubles included). Throw Error{kFormat}
// for a trace that fails validate().
std::string trace_to_json(const Trace& trace);
std::vector<std::byte> trace_to_binary(const Trace& trace);

// Reads a trace file, detecting the form from its first bytes. Errors name the path.
Trace load_trace(const std::string& path);
// Writes through a temporary file renamed into place, so a reader never sees half a trace.
// The form defaults to trace_format_for_path(path).
void save_trace(const Trace& trace, const std::string& path, std::optional<TraceFormat> format = {});

}  // namespace teraio::trace
