#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>

#include "shared_link.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

// Operators examined per trace (below): a bound over fewer operators is still a bound; this
// keeps the cost at O(operators examined × tensors).
constexpr std::size_t kMaxOps = 256;
constexpr std::size_t kPerRun = 4;
constexpr std::size_t kMaxCandidates = 2048;
// Operators examined besides the most over budget, and paired under the shared link rate
// (below): the most over budget in each of this many slices of every phase (slice_peaks).
constexpr std::size_t kSlices = 64;

// A tensor that could be off the device while operator k runs: it must leave after
// `release` (the end of its previous use) and be back by `deadline` (the start of its next
// use), in seconds from the start of k's step (negative or past the step when the idle
// period wraps around the step boundary).
struct Window {
  double release, deadline, bytes;
  std::size_t deadline_op;  // the operator of the next use, plus the step's operator count if it wraps
};

// Of the windows in the order bytes are chosen (`w` sorted), the first `need` bytes: the
// largest (bytes chosen from window i to the last one chosen) / bw - slack(w[i]) over i, and
// the window i that gives it (w.size() when nothing stalls).
struct Worst {
  double stall = 0;
  std::size_t at = 0;
};

template <typename Slack>
Worst worst_stall(const std::vector<Window>& w, double need, double bw, Slack slack) {
  std::size_t chosen = 0;
  double left = need;
  while (chosen < w.size() && left > 0) left -= w[chosen++].bytes;
  // left <= 0: the last one chosen counts only in part (> 0: the windows hold less than need).
  Worst worst{0, w.size()};
  double acc = 0;
  for (std::size_t i = chosen; i-- > 0;) {
    acc += w[i].bytes + (i + 1 == chosen ? left : 0.0);
    const double stall = acc / bw - slack(w[i]);
    if (stall > worst.stall) worst = {stall, i};
  }
  return worst;
}

// The least stall before k that moving `need` bytes out costs at `bw`: choosing the bytes
// released earliest minimizes, for every t0, the bytes that must leave within [t0, k), so
// that choice gives the smallest max over t0 of (bytes released after t0) / bw - (k - t0).
double out_stall(std::vector<Window>& w, double need, double bw, double k_start) {
  std::sort(w.begin(), w.end(), [](const Window& a, const Window& b) { return a.release < b.release; });
  return worst_stall(w, need, bw, [&](const Window& x) { return k_start - x.release; }).stall;
}

// The same for bringing them back after k ends, choosing the latest deadlines. The stall
// falls within [k_end, the binding deadline]: for every deadline d, no choice of X bytes has
// fewer due by d than this one, so every plan waits that long inside that window.
struct InStall {
  double stall = 0;
  std::size_t window_end = 0;  // the binding deadline's operator (as Window::deadline_op)
};

InStall in_stall(std::vector<Window>& w, double need, double bw, double k_end, std::size_t k_next) {
  std::sort(w.begin(), w.end(), [](const Window& a, const Window& b) { return a.deadline > b.deadline; });
  const Worst worst = worst_stall(w, need, bw, [&](const Window& x) { return x.deadline - k_end; });
  return {worst.stall, worst.at < w.size() ? w[worst.at].deadline_op : k_next};
}

// A stretch of the repeating step in which the incoming link must carry some operator's
// returns, as the operator boundaries it spans: boundary b is just before operator b, where
// waits go (end may pass the step's operator count: it wraps). Boundaries, not seconds: times
// computed as start + step - step round, and stretches that touch could look apart.
struct Arc {
  std::int64_t begin, end;
  double stall;
  trace::OpIndex op;
};

// Arcs chosen among `arcs` (sorted by end) strictly inside (lo, hi), pairwise apart: the
// largest sum of stalls (weighted interval scheduling). Apart means not even touching: a wait
// at the moment two arcs share could carry one tensor's return that both count.
double best_disjoint(const std::vector<Arc>& arcs, std::int64_t lo, std::int64_t hi,
                     std::vector<trace::OpIndex>* ops) {
  std::vector<const Arc*> in;
  for (const Arc& a : arcs)
    if (a.begin > lo && a.end < hi) in.push_back(&a);
  std::vector<double> best(in.size() + 1, 0.0);
  std::vector<std::size_t> prev(in.size() + 1, 0);
  std::vector<bool> take(in.size() + 1, false);
  for (std::size_t i = 1; i <= in.size(); ++i) {
    const Arc& a = *in[i - 1];
    // Arcs before i that end before a begins: a prefix, since they are sorted by end.
    const std::size_t j = static_cast<std::size_t>(
        std::lower_bound(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(i - 1), a.begin,
                         [](const Arc* b, std::int64_t t) { return b->end < t; }) -
        in.begin());
    best[i] = best[i - 1];
    prev[i] = i - 1;
    if (a.stall + best[j] > best[i]) {
      best[i] = a.stall + best[j];
      prev[i] = j;
      take[i] = true;
    }
  }
  if (ops != nullptr)
    for (std::size_t i = in.size(); i > 0; i = prev[i])
      if (take[i]) ops->push_back(in[i - 1]->op);
  return best.back();
}

// The largest sum of stalls over arcs pairwise apart on the circle of the step: at most one
// chosen arc can cross the step boundary, so try none and each in turn. Arcs apart add up:
// each needs its own link time inside its own stretch, for returns no other arc can count
// (a tensor off at both operators returns once, after the later one, which is past the
// earlier one's stretch).
double disjoint_stalls(std::vector<Arc> arcs, std::int64_t n, std::vector<trace::OpIndex>& ops) {
  std::sort(arcs.begin(), arcs.end(), [](const Arc& a, const Arc& b) { return a.end < b.end; });
  // Arcs begin at or after boundary 0. One that ends at boundary n (the next step's 0) touches
  // one that begins at 0, so it is tried as a crossing one.
  double total = best_disjoint(arcs, -1, n, &ops);
  for (const Arc& c : arcs) {
    if (c.end < n) continue;
    if (c.end - c.begin >= n) {  // the whole circle: alone
      if (c.stall > total) total = c.stall, ops = {c.op};
      continue;
    }
    std::vector<trace::OpIndex> with;
    const double sum = c.stall + best_disjoint(arcs, c.end - n, c.begin, &with);
    if (sum > total) {
      total = sum;
      with.push_back(c.op);
      ops = std::move(with);
    }
  }
  return total;
}

// Operators examined: the 256 most over budget, and in every run of consecutive operators
// over budget the few most over it, so that each peak of a repeating pattern (micro-batches)
// is seen.
std::vector<std::size_t> candidates(const std::vector<std::uint64_t>& demand, std::uint64_t budget) {
  const auto by_demand = [&](std::size_t a, std::size_t c) { return demand[a] > demand[c]; };
  std::vector<std::size_t> over, picked;
  for (std::size_t k = 0; k < demand.size(); ++k)
    if (demand[k] > budget) over.push_back(k);
  for (std::size_t a = 0; a < over.size();) {
    std::size_t b = a + 1;
    while (b < over.size() && over[b] == over[b - 1] + 1) ++b;
    std::vector<std::size_t> run(over.begin() + static_cast<std::ptrdiff_t>(a),
                                 over.begin() + static_cast<std::ptrdiff_t>(b));
    std::stable_sort(run.begin(), run.end(), by_demand);
    run.resize(std::min(run.size(), kPerRun));
    picked.insert(picked.end(), run.begin(), run.end());
    a = b;
  }
  std::stable_sort(over.begin(), over.end(), by_demand);
  over.resize(std::min(over.size(), kMaxOps));
  picked.insert(picked.end(), over.begin(), over.end());
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  if (picked.size() > kMaxCandidates) {
    std::stable_sort(picked.begin(), picked.end(), by_demand);
    picked.resize(kMaxCandidates);
  }
  return picked;
}

// In each phase of the step (forward, backward, optimizer, other), the operator most over the
// budget in each of kSlices slices of that phase's time, if any is over. Equal time, not equal
// operator counts, and per phase: an optimizer of a few hundred long operators at the end of a
// backward pass of hundreds of thousands keeps its own slices, though its demand is lower.
std::vector<std::size_t> slice_peaks(const trace::Trace& t, const std::vector<std::uint64_t>& demand,
                                     std::uint64_t budget) {
  constexpr std::size_t kPhases = static_cast<std::size_t>(trace::Phase::kOther) + 1;
  std::array<double, kPhases> total{}, at{};
  for (const trace::Operator& op : t.ops) total[static_cast<std::size_t>(op.phase)] += op.duration_s;
  const std::size_t none = demand.size();
  std::vector<std::size_t> best(kPhases * kSlices, none);
  for (std::size_t k = 0; k < t.ops.size(); ++k) {
    const auto phase = static_cast<std::size_t>(t.ops[k].phase);
    const std::size_t slice =
        total[phase] > 0 ? std::min(kSlices - 1, static_cast<std::size_t>(at[phase] / total[phase] * kSlices))
                         : 0;
    at[phase] += t.ops[k].duration_s;
    std::size_t& b = best[phase * kSlices + slice];
    if (demand[k] > budget && (b == none || demand[k] > demand[b])) b = k;
  }
  std::vector<std::size_t> peaks;
  for (const std::size_t k : best)
    if (k != none) peaks.push_back(k);
  std::sort(peaks.begin(), peaks.end());
  return peaks;
}

// The first `need` bytes of `w` in its order, the last in part, as (moment, bytes) by moment:
// `w` as in_stall leaves it (latest deadline first) gives the returns, as out_stall leaves it
// (earliest release first) the departures.
std::vector<Timed> first_bytes(const std::vector<Window>& w, double need, bool by_deadline) {
  std::vector<Timed> chosen;
  for (std::size_t i = 0; i < w.size() && need > 0; ++i) {
    chosen.push_back({by_deadline ? w[i].deadline : w[i].release, std::min(need, w[i].bytes)});
    need -= w[i].bytes;
  }
  if (by_deadline) std::reverse(chosen.begin(), chosen.end());
  return chosen;
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
  // While both PCIe directions are busy they share pcie_duplex_bandwidth (shared_link.hpp); a cap
  // at or above their sum is none.
  const bool shared = (host || (ssd && !hw.gpudirect)) && hw.shared_link_rate() > 0;
  const LinkRates rates{in_bw, out_bw,
                        hw.pcie_duplex_bandwidth +
                            (ssd && hw.gpudirect ? hw.ssd_read_bandwidth + hw.ssd_write_bandwidth : 0.0)};
  // The slices' peaks are examined alone too: without them an optimizer's operators, less over
  // the budget than the backward pass's, were never examined, and on W3 one binds.
  const std::vector<std::size_t> sliced = slice_peaks(t, demand, hw.gpu_budget);
  std::vector<std::size_t> examined = candidates(demand, hw.gpu_budget), paired;
  examined.insert(examined.end(), sliced.begin(), sliced.end());
  std::sort(examined.begin(), examined.end());
  examined.erase(std::unique(examined.begin(), examined.end()), examined.end());
  if (shared) paired = sliced;
  std::vector<Forced> forced;
  std::vector<Window> windows, changed;
  std::vector<Arc> arcs;
  for (const std::size_t k : examined) {
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
      const std::size_t deadline_op = next != u.end() ? *next : u.front() + n;
      windows.push_back({release, deadline, double(x.bytes), deadline_op});
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
    const InStall in = in_stall(windows, need, in_bw, start[k + 1], k + 1);
    if (std::binary_search(paired.begin(), paired.end(), k))
      forced.push_back({k, start[k], start[k + 1], first_bytes(windows, need, true),
                        first_bytes(changed, need_out, false)});
    if (in.stall > 0)
      arcs.push_back({static_cast<std::int64_t>(k + 1), static_cast<std::int64_t>(in.window_end), in.stall,
                      static_cast<trace::OpIndex>(k)});
    // Both stalls may fall on the same moment of the repeating step (a wrapping window), so
    // only the larger one is sure to add up.
    const double stall = std::max(stall_out, in.stall);
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
  // Under the shared rate, one operator's returns and another's departures in the same stretch.
  // Each operator keeps its pairing with the most stall as a stretch that can add up (below).
  for (const Forced& after : forced) {
    Arc most{0, 0, 0, 0};
    for (const Forced& before : forced) {
      const double stall = shared_link_stall(after, before, step, rates);
      if (stall <= most.stall) continue;
      most = {static_cast<std::int64_t>(after.op + 1),
              static_cast<std::int64_t>(before.op + (before.op <= after.op ? n : 0)), stall,
              static_cast<trace::OpIndex>(after.op)};
      if (step + stall <= b.bound_s) continue;
      b.bound_s = step + stall;
      b.binding_op = static_cast<trace::OpIndex>(after.op);
      b.reason =
          cat("the returns after operator ", after.op, " (", t.ops[after.op].name,
              ") and the departures before operator ", before.op, " (", t.ops[before.op].name,
              ") share the link's ", format_bandwidth(hw.pcie_duplex_bandwidth),
              " both ways at once in the stretch between them: stall at least ", format_duration(stall));
    }
    if (most.stall > 0) arcs.push_back(most);
  }
  // Operators whose returns (or returns and departures) must cross the link in stretches of
  // the step that do not overlap (one per micro-batch, say) each cost their own stall: the sum
  // is a bound too.
  std::vector<trace::OpIndex> peaks;
  const double combined = step + disjoint_stalls(std::move(arcs), static_cast<std::int64_t>(n), peaks);
  if (peaks.size() > 1 && combined > b.bound_s) {
    std::sort(peaks.begin(), peaks.end());
    b.bound_s = combined;
    b.binding_op = peaks.front();
    b.peaks = peaks.size();
    b.reason = cat(peaks.size(), " operators (first ", peaks.front(), " (", t.ops[peaks.front()].name,
                   "), last ", peaks.back(), " (", t.ops[peaks.back()].name,
                   ")) must each move tensors across the link in stretches of the step that do not overlap: "
                   "their stalls add up to at least ",
                   format_duration(combined - step));
  }
  b.max_share = b.ideal_s / b.bound_s;
  return b;
}

}  // namespace teraio::plan
