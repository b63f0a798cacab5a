#include <algorithm>
#include <limits>

#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

// Operators examined per trace: the most over budget ones. A bound over fewer operators is
// still a bound; this keeps the cost at O(kMaxOps × tensors).
constexpr std::size_t kMaxOps = 256;

// A tensor that could be off the device while operator k runs: it must leave after
// `release` (the end of its previous use) and be back by `deadline` (the start of its next
// use), in seconds from the start of k's step (negative or past the step when the idle
// period wraps around the step boundary).
struct Window {
  double release, deadline, bytes;
};

// The least stall before k that moving `need` bytes out costs at `bw`: choosing the bytes
// released earliest minimizes, for every t0, the bytes that must leave within [t0, k), so
// that choice gives the smallest max over t0 of (bytes released after t0) / bw - (k - t0).
double out_stall(std::vector<Window>& w, double need, double bw, double k_start) {
  std::sort(w.begin(), w.end(), [](const Window& a, const Window& b) { return a.release < b.release; });
  std::size_t chosen = 0;
  for (double acc = 0; chosen < w.size() && acc < need; ++chosen) acc += w[chosen].bytes;
  double acc = 0, stall = 0;
  double left = need;
  for (std::size_t i = 0; i < chosen; ++i) left -= w[i].bytes;  // <= 0: the last one is partial
  for (std::size_t i = chosen; i-- > 0;) {
    acc += w[i].bytes + (i + 1 == chosen ? left : 0.0);
    stall = std::max(stall, acc / bw - (k_start - w[i].release));
  }
  return stall;
}

// The same for bringing them back after k ends, choosing the latest deadlines.
double in_stall(std::vector<Window>& w, double need, double bw, double k_end) {
  std::sort(w.begin(), w.end(), [](const Window& a, const Window& b) { return a.deadline > b.deadline; });
  std::size_t chosen = 0;
  for (double acc = 0; chosen < w.size() && acc < need; ++chosen) acc += w[chosen].bytes;
  double left = need;
  for (std::size_t i = 0; i < chosen; ++i) left -= w[i].bytes;
  double acc = 0, stall = 0;
  for (std::size_t i = chosen; i-- > 0;) {
    acc += w[i].bytes + (i + 1 == chosen ? left : 0.0);
    stall = std::max(stall, acc / bw - (w[i].deadline - k_end));
  }
  return stall;
}

}  // namespace

StepBound step_time_bound(const trace::Trace& t, const Hardware& hw) {
  if (t.step_begins.size() > 1) return step_time_bound(trace::extract_step(t, 0), hw);
  StepBound b;
  const std::size_t n = t.ops.size();
  const std::vector<double> start = trace::op_start_times(t);
  const double step = start[n];
  b.ideal_s = step;
  b.bound_s = step;
  b.reason = "no operator is over the budget";
  if (n == 0) return b;
  const bool host = hw.host_capacity > 0, ssd = hw.ssd_capacity > 0;
  double out_bw = 0, in_bw = 0;
  if (host || (ssd && !hw.gpudirect)) {
    out_bw += hw.d2h_bandwidth;
    in_bw += hw.h2d_bandwidth;
  }
  if (ssd && hw.gpudirect) {
    out_bw += hw.ssd_write_bandwidth;
    in_bw += hw.ssd_read_bandwidth;
  }
  const std::vector<std::uint64_t> demand = trace::memory_demand(t);
  const std::vector<std::uint64_t> active = trace::active_bytes(t);
  std::vector<std::size_t> over;
  for (std::size_t k = 0; k < n; ++k)
    if (demand[k] > hw.gpu_budget) over.push_back(k);
  if (over.empty()) return b;
  b.reason = "bandwidth does not bind: every operator's excess can move out and back in time";
  for (const std::size_t k : over) {
    if (active[k] + t.untracked_bytes > hw.gpu_budget || out_bw <= 0 || in_bw <= 0) {
      b.bound_s = std::numeric_limits<double>::infinity();
      b.max_share = 0;
      b.binding_op = static_cast<trace::OpIndex>(k);
      b.reason = out_bw <= 0 || in_bw <= 0
                     ? cat("operator ", k,
                           " is over the budget and no tier can take tensors (capacity or bandwidth 0)")
                     : cat("operator ", k, " (", t.ops[k].name, ") alone needs ",
                           format_bytes(active[k] + t.untracked_bytes), ", more than the budget");
      return b;
    }
  }
  std::stable_sort(over.begin(), over.end(),
                   [&](std::size_t a, std::size_t c) { return demand[a] > demand[c]; });
  if (over.size() > kMaxOps) over.resize(kMaxOps);
  std::vector<Window> windows, changed;
  for (const std::size_t k : over) {
    const double need = double(demand[k] - hw.gpu_budget);
    windows.clear();
    // Tensors whose previous use only read them may hold a valid copy off the device from an
    // earlier trip (Migration::kept_copy), so they leave without crossing the link: only the
    // rest of `need` costs outgoing bandwidth, and only the others can be that rest.
    changed.clear();
    double unchanged = 0;
    for (const auto& x : t.tensors) {
      const auto& u = x.uses;
      if (u.empty()) continue;
      const auto next = std::upper_bound(u.begin(), u.end(), static_cast<trace::OpIndex>(k));
      if (next != u.begin() && *(next - 1) == k) continue;             // in use at k
      if (!x.persistent && (k < u.front() || k > u.back())) continue;  // not alive at k
      const double release = next != u.begin() ? start[*(next - 1) + 1] : start[u.back() + 1] - step;
      const double deadline = next != u.end() ? start[*next] : start[u.front()] + step;
      windows.push_back({release, deadline, double(x.bytes)});
      const trace::OpIndex previous = next != u.begin() ? *(next - 1) : u.back();
      if (trace::only_reads(x, previous))
        unchanged += double(x.bytes);
      else
        changed.push_back(windows.back());
    }
    // Every tensor is used every step, so what is out at k returns every step.
    const double need_out = std::max(0.0, need - unchanged);
    const double traffic = std::max(need_out / out_bw, need / in_bw);
    const double stall_out = need_out > 0 ? out_stall(changed, need_out, out_bw, start[k]) : 0.0;
    const double stall_in = in_stall(windows, need, in_bw, start[k + 1]);
    // Both stalls may fall on the same moment of the repeating step (a wrapping window), so
    // only the larger one is sure to add up.
    const double stall = std::max(stall_out, stall_in);
    const double candidate = std::max(traffic, step + stall);
    if (candidate <= b.bound_s) continue;
    b.bound_s = candidate;
    b.binding_op = static_cast<trace::OpIndex>(k);
    const std::string what = cat("operator ", k, " (", t.ops[k].name, ") is ",
                                 format_bytes(demand[k] - hw.gpu_budget), " over the budget");
    b.reason = traffic >= step + stall
                   ? cat(what, ", which must leave and return every step: ", format_duration(traffic))
                   : cat(what,
                         "; moving it out after the tensors' previous uses and back before their next ones "
                         "stalls at least ",
                         format_duration(stall));
  }
  b.max_share = b.ideal_s / b.bound_s;
  return b;
}

}  // namespace teraio::plan
