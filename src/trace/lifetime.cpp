#include "teraio/trace/lifetime.hpp"

#include <algorithm>
#include <random>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::trace {

std::vector<double> op_start_times(const Trace& trace) {
  std::vector<double> start(trace.ops.size() + 1, 0.0);
  for (std::size_t k = 0; k < trace.ops.size(); ++k) start[k + 1] = start[k] + trace.ops[k].duration_s;
  return start;
}

std::vector<InactivePeriod> inactive_periods(const Trace& trace) {
  return inactive_periods(trace, op_start_times(trace));
}

std::vector<InactivePeriod> inactive_periods(const Trace& trace, const std::vector<double>& start_s) {
  const auto n = static_cast<OpIndex>(trace.ops.size());
  if (start_s.size() != trace.ops.size() + 1)
    throw Error(ErrorKind::kInvalidArgument, cat("inactive_periods: ", start_s.size(), " start times for ",
                                                 trace.ops.size(), " operators"));
  std::size_t total_uses = 0;
  for (const Tensor& t : trace.tensors) total_uses += t.uses.size();
  std::vector<InactivePeriod> periods;
  periods.reserve(total_uses);
  for (std::size_t i = 0; i < trace.tensors.size(); ++i) {
    const Tensor& t = trace.tensors[i];
    const auto index = static_cast<std::uint32_t>(i);
    for (std::size_t u = 1; u < t.uses.size(); ++u) {
      const OpIndex last = t.uses[u - 1];
      const OpIndex next = t.uses[u];
      if (next - last < 2) continue;
      periods.push_back(
          {index, last, next, false, false, next - last - 1, start_s[next] - start_s[last + 1]});
    }
    if (!t.persistent && t.held_after_use > 0) {
      const OpIndex last = t.uses.back();
      const OpIndex after = release_op(t) + 1;
      periods.push_back(
          {index, last, after, false, true, t.held_after_use, start_s[after] - start_s[last + 1]});
    }
    if (t.persistent && !t.uses.empty()) {
      // The step repeats: after its last use the tensor idles to the end of the step and on
      // through the next step's operators up to its first use there.
      const OpIndex last = t.uses.back();
      const OpIndex first = t.uses.front();
      const std::uint32_t idle_ops = (n - 1 - last) + first;
      if (idle_ops == 0) continue;
      const double idle_s = (start_s[n] - start_s[last + 1]) + start_s[first];
      periods.push_back({index, last, first, true, false, idle_ops, idle_s});
    }
  }
  return periods;
}

std::vector<std::uint64_t> memory_demand(const Trace& trace) {
  const std::size_t n = trace.ops.size();
  // Difference array: a step-local tensor adds its bytes at its first use and removes them
  // once it is released (its last use, or later where the program held it), so the whole
  // curve costs O(ops + tensors). Unsigned wrap-around in the intermediate entries cancels out
  // in the prefix sums.
  std::vector<std::uint64_t> diff(n + 1, 0);
  std::uint64_t always = trace.untracked_bytes;
  for (const Tensor& t : trace.tensors) {
    if (t.uses.empty()) continue;
    if (t.persistent) {
      always += t.bytes;
    } else {
      diff[t.uses.front()] += t.bytes;
      diff[release_op(t) + 1] -= t.bytes;
    }
  }
  std::vector<std::uint64_t> demand(n);
  std::uint64_t running = 0;
  for (std::size_t k = 0; k < n; ++k) {
    running += diff[k];
    demand[k] = always + running;
  }
  return demand;
}

std::vector<std::uint64_t> active_bytes(const Trace& trace) {
  std::vector<std::uint64_t> active(trace.ops.size(), 0);
  for (const Tensor& t : trace.tensors)
    for (OpIndex u : t.uses) active[u] += t.bytes;
  return active;
}

void scale_durations(Trace& trace, double factor) {
  if (!(factor > 0) || factor > 100)
    throw Error(ErrorKind::kInvalidArgument, cat("the time scale must be in (0, 100], not ", factor));
  for (Operator& op : trace.ops) op.duration_s *= factor;
}

std::size_t free_at_last_use(Trace& trace) {
  std::size_t held = 0;
  for (Tensor& t : trace.tensors) {
    if (t.held_after_use == 0) continue;
    t.held_after_use = 0;
    if (!t.persistent) ++held;  // a persistent tensor's is never counted (release_op)
  }
  return held;
}

void jitter_durations(Trace& trace, double spread, std::uint64_t seed) {
  if (!(spread >= 0) || spread >= 1)
    throw Error(ErrorKind::kInvalidArgument, cat("the jitter must be in [0, 1), not ", spread));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> factor(1 - spread, 1 + spread);
  for (Operator& op : trace.ops) op.duration_s *= factor(rng);
}

Trace extract_step(const Trace& trace, std::size_t step) {
  if (step >= trace.step_begins.size())
    throw Error(ErrorKind::kInvalidArgument,
                cat("step ", step, " is out of range: the trace has ", trace.step_begins.size(), " steps"));
  const OpIndex begin = trace.step_begins[step];
  const auto end = step + 1 < trace.step_begins.size() ? trace.step_begins[step + 1]
                                                       : static_cast<OpIndex>(trace.ops.size());
  Trace out;
  out.untracked_bytes = trace.untracked_bytes;
  out.source = trace.source;
  out.ops.assign(trace.ops.begin() + begin, trace.ops.begin() + end);
  for (const Tensor& t : trace.tensors) {
    // Uses are sorted, so the step's uses are one contiguous run.
    auto first = std::lower_bound(t.uses.begin(), t.uses.end(), begin);
    auto last = std::lower_bound(first, t.uses.end(), end);
    if (first == last) continue;
    Tensor& copy = out.tensors.emplace_back();
    copy.id = t.id;
    copy.bytes = t.bytes;
    copy.kind = t.kind;
    copy.persistent = t.persistent;
    copy.name = t.name;
    copy.uses.reserve(static_cast<std::size_t>(last - first));
    for (auto it = first; it != last; ++it) {
      copy.uses.push_back(*it - begin);
      if (only_reads(t, *it)) copy.read_only_uses.push_back(*it - begin);
    }
    // Held past its last use: only where that use is in this step, and not past its end.
    if (last == t.uses.end()) copy.held_after_use = std::min(release_op(t), end - 1) - t.uses.back();
  }
  return out;
}

}  // namespace teraio::trace
