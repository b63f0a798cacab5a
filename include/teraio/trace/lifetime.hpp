// trace/lifetime: when each tensor is active and when it is idle. An inactive period is the
// gap between two consecutive uses of a tensor; for persistent tensors the gap between the
// last use in a step and the first use of the next step wraps around the step boundary; for a
// step-local tensor the program holds past its last use, the operators until it is freed.
// These periods are what the planner can move tensors out of device memory in.
// Every function here expects a trace that passed validate(); each costs O(ops + uses).
#pragma once

#include <cstdint>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::trace {

struct InactivePeriod {
  std::uint32_t tensor = 0;  // index into Trace::tensors
  OpIndex last_use = 0;      // the tensor is used by this operator, then idle
  OpIndex next_use = 0;      // ... until this operator uses it again
  // True when next_use belongs to the next step (next_use <= last_use in op indices).
  bool wraps = false;
  // True when the period ends with the tensor freed (held_after_use), not used: a tensor
  // moved out in it never has to come back. next_use is then the operator after its release.
  bool released = false;
  // Number of operators strictly between the two uses, and their total duration.
  std::uint32_t idle_ops = 0;
  double idle_s = 0;
};

// Cumulative operator start times: start_s[k] = sum of durations of ops [0, k); size n+1,
// so start_s[n] is the step time. The unit every time-based computation shares.
std::vector<double> op_start_times(const Trace& trace);

// All inactive periods of a single-step trace, sorted by (tensor, last_use). Periods with no
// operator in between (idle_ops == 0) are omitted: nothing can move in them.
// A multi-step trace is treated as one repeating unit: wrapping periods run from the last
// use in the trace to the first use in it.
std::vector<InactivePeriod> inactive_periods(const Trace& trace);
// The same, reusing start times from op_start_times(trace) (throws Error{kInvalidArgument}
// when their count does not match).
std::vector<InactivePeriod> inactive_periods(const Trace& trace, const std::vector<double>& start_s);

// Device memory demand while each operator runs without any migration: untracked bytes plus
// every persistent tensor plus every step-local tensor from its first use to its release_op
// (inclusive). Size ops.size().
std::vector<std::uint64_t> memory_demand(const Trace& trace);

// Bytes of the tensors each operator itself uses (the "active" share). Size ops.size().
std::vector<std::uint64_t> active_bytes(const Trace& trace);

// The operators and tensor uses of step `step` of a multi-step trace, re-indexed from 0
// (tensors not used in that step are dropped, since a tensor without uses is invalid; the
// others keep their id, size, kind and persistence). Throws
// Error{kInvalidArgument} for a step out of range.
Trace extract_step(const Trace& trace, std::size_t step);

// Every operator's duration multiplied by `factor`. TeraIO's profile times each operator with
// CUDA events while the host dispatches operators one at a time and runs its observer, which
// inflates the times; a factor of measured GPU time over profiled time gives the planner and
// the bound the compute a real step has.
// Throws Error{kInvalidArgument} unless 0 < factor <= 100.
void scale_durations(Trace& trace, double factor);

// Forgets the releases the profile recorded (Tensor::held_after_use): every step-local tensor is
// then freed at its last use, as in a profile taken without Session(record_releases=True). Planned
// this way and simulated on the trace as recorded, a plan runs over its budget where the program
// frees late, as such a plan does at run time. Returns how many step-local tensors had been held
// past their last use.
std::size_t free_at_last_use(Trace& trace);

// Every operator's duration multiplied by its own factor drawn uniformly from
// [1 - spread, 1 + spread] (std::mt19937_64 seeded with `seed`: the same seed, the same times).
// Two profiles of one step differ this way; planning on jittered copies shows how much a plan
// depends on the profile it was made from. Throws Error{kInvalidArgument} unless 0 <= spread < 1.
void jitter_durations(Trace& trace, double spread, std::uint64_t seed);

}  // namespace teraio::trace
