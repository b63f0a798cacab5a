#include "planner_greedy.hpp"

#include <algorithm>
#include <optional>
#include <queue>

#include "bandwidth_ledger.hpp"
#include "circular.hpp"
#include "teraio/plan/range_tree.hpp"

namespace teraio::plan::detail {
namespace {

// Operators of zero duration still need their memory brought under budget: a tiny weight
// keeps them visible to the score without changing the order of real time spans.
constexpr double kMinWeight_s = 1e-12;

struct QueueEntry {
  double score;
  trace::TensorId tensor;
  trace::OpIndex last_use;
  std::uint32_t period;
};

// Best score first; equal scores by tensor id then position, so the order never depends on
// anything but the inputs.
struct QueueOrder {
  bool operator()(const QueueEntry& a, const QueueEntry& b) const {
    if (a.score != b.score) return a.score < b.score;
    if (a.tensor != b.tensor) return a.tensor > b.tensor;
    return a.last_use > b.last_use;
  }
};

Route offload_route(Tier tier) {
  return tier == Tier::kSsd ? Route::kOffloadSsd : Route::kOffloadHost;
}
Route prefetch_route(Tier tier) {
  return tier == Tier::kSsd ? Route::kPrefetchSsd : Route::kPrefetchHost;
}

std::vector<double> demand_weights(const std::vector<double>& start_s) {
  std::vector<double> w(start_s.size() - 1);
  for (std::size_t k = 0; k + 1 < start_s.size(); ++k) w[k] = start_s[k + 1] - start_s[k] + kMinWeight_s;
  return w;
}

std::vector<double> durations(const std::vector<double>& start_s) {
  std::vector<double> d(start_s.size() - 1);
  for (std::size_t k = 0; k + 1 < start_s.size(); ++k) d[k] = start_s[k + 1] - start_s[k];
  return d;
}

class Greedy {
 public:
  explicit Greedy(const GreedyInput& in)
      : in_(in),
        periods_(*in.periods),
        n_(in.demand.size()),
        budget_(static_cast<std::int64_t>(in.hardware.gpu_budget)),
        smallest_(smallest_moved_bytes(in.hardware, in.options)),
        ledger_(durations(in.start_s), in.hardware),
        demand_(in.demand, demand_weights(in.start_s), budget_),
        host_(n_),
        on_ssd_(in.trace->tensors.size(), false),
        accepted_at_(periods_.size(), kNone) {
    index_writes();
  }

  GreedyResult run() {
    select();
    mark_kept_copies();
    if (in_.options.early_prefetch) move_prefetches_earlier();
    GreedyResult out;
    out.accepted = std::move(accepted_);
    out.demand_after = demand_.values();
    out.host_peak = static_cast<std::uint64_t>(std::max<std::int64_t>(0, host_.max()));
    out.ssd_used = ssd_used_;
    out.evaluations = evaluations_;
    out.prefetch_rate_host = ledger_.rate(prefetch_route(Tier::kHost));
    out.prefetch_rate_ssd = ledger_.rate(prefetch_route(Tier::kSsd));
    return out;
  }

 private:
  Window window_of(const trace::InactivePeriod& p) const {
    return {(static_cast<std::size_t>(p.last_use) + 1) % n_, p.idle_ops};
  }
  std::uint64_t bytes_of(const trace::InactivePeriod& p) const { return in_.trace->tensors[p.tensor].bytes; }
  double request_bytes(Route route) const { return in_.hardware.request_latency_s * ledger_.rate(route); }

  DemandTree::Summary demand_over(Window w, std::size_t lo, std::size_t hi) {
    DemandTree::Summary total;
    for (const Segment& seg : segments(n_, w, lo, hi)) {
      const DemandTree::Summary part = demand_.query(seg.op_begin, seg.op_end);
      total.max = std::max(total.max, part.max);
      total.over_weight += part.over_weight;
      total.over_excess += part.over_excess;
    }
    return total;
  }

  void demand_add(Window w, std::size_t lo, std::size_t hi, std::int64_t delta) {
    for (const Segment& seg : segments(n_, w, lo, hi)) demand_.add(seg.op_begin, seg.op_end, delta);
  }

  bool tier_has_room(const trace::InactivePeriod& p, Tier tier) const {
    const std::uint64_t s = bytes_of(p);
    if (tier == Tier::kSsd)
      return in_.hardware.ssd_capacity > 0 &&
             (on_ssd_[p.tensor] || ssd_used_ + s <= in_.hardware.ssd_capacity);
    if (in_.hardware.host_capacity == 0) return false;
    std::int64_t peak = 0;
    for (const Segment& seg : segments(n_, window_of(p), 0, p.idle_ops))
      peak = std::max(peak, host_.max(seg.op_begin, seg.op_end));
    return static_cast<std::uint64_t>(peak) + s <= in_.hardware.host_capacity;
  }

  // The earliest offload and the latest prefetch the free bandwidth allows on `tier`, and
  // the over-budget memory-time the period then removes, per byte moved. A period that ends
  // in the tensor's release has no prefetch: it is away from the offload to the window's end.
  std::optional<Choice> evaluate_tier(const trace::InactivePeriod& p, Tier tier) {
    const Route off = offload_route(tier);
    const Route pre = prefetch_route(tier);
    if (!ledger_.usable(off) || !ledger_.usable(pre)) return std::nullopt;
    if (tier == Tier::kSsd && !tier_has_room(p, tier)) return std::nullopt;
    const Window w = window_of(p);
    const auto s = static_cast<double>(bytes_of(p));
    const std::size_t last = ledger_.earliest_finish(off, w, w.length, s + request_bytes(off));
    if (last == kNotFound || last + (p.released ? 1 : 2) >= w.length) return std::nullopt;
    const std::size_t first =
        p.released ? w.length : ledger_.latest_start(pre, w, last + 2, s + request_bytes(pre));
    if (first == kNotFound) return std::nullopt;
    const DemandTree::Summary over = demand_over(w, last + 1, first);
    if (over.over_weight <= 0) return std::nullopt;
    // The host check is a range query over the whole window: done last, only when needed.
    if (tier == Tier::kHost && !tier_has_room(p, tier)) return std::nullopt;
    return choice(tier, last, first, over, s, false);
  }

  // The choice with its score, the over-budget memory-time it removes per byte; none when that
  // is not positive.
  std::optional<Choice> choice(Tier tier, std::size_t last, std::size_t first,
                               const DemandTree::Summary& over, double bytes, bool clean) const {
    Choice c;
    c.tier = tier;
    c.clean = clean;
    c.offload_last = last;
    c.prefetch_booked = first;
    c.prefetch_issue = first;
    c.score = in_.options.credit_over_budget_only ? std::min(over.over_weight, over.over_excess / bytes)
                                                  : over.over_weight;
    if (!(c.score > 0)) return std::nullopt;
    return c;
  }

  // A clean period first (nothing to copy out); else SSD first, and host memory when the SSD
  // routes cannot fit the period (or its space is used up).
  std::optional<Choice> evaluate(std::uint32_t index) {
    ++evaluations_;
    const trace::InactivePeriod& p = periods_[index];
    if (auto c = evaluate_clean(index)) return c;
    if (auto c = evaluate_tier(p, Tier::kSsd)) return c;
    return evaluate_tier(p, Tier::kHost);
  }

  // --- copies kept across read-only uses -----------------------------------------------------

  // Per tensor, a running count of the uses that may write it (prefix sums over its uses),
  // and where its periods start in periods_ (sorted by tensor, then last use).
  void index_writes() {
    const auto& tensors = in_.trace->tensors;
    write_base_.resize(tensors.size() + 1, 0);
    for (std::size_t i = 0; i < tensors.size(); ++i)
      write_base_[i + 1] = write_base_[i] + tensors[i].uses.size() + 1;
    writes_before_.assign(write_base_.back(), 0);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const trace::Tensor& t = tensors[i];
      std::uint32_t count = 0;
      for (std::size_t u = 0; u < t.uses.size(); ++u) {
        writes_before_[write_base_[i] + u] = count;
        count += trace::only_reads(t, t.uses[u]) ? 0 : 1;
      }
      writes_before_[write_base_[i] + t.uses.size()] = count;
    }
    periods_begin_.assign(tensors.size() + 1, 0);
    for (const trace::InactivePeriod& p : periods_) ++periods_begin_[p.tensor + 1];
    for (std::size_t i = 0; i < tensors.size(); ++i) periods_begin_[i + 1] += periods_begin_[i];
  }

  std::size_t use_position(const trace::Tensor& t, trace::OpIndex op) const {
    return static_cast<std::size_t>(std::lower_bound(t.uses.begin(), t.uses.end(), op) - t.uses.begin());
  }

  // Whether every use of tensor `ti` from operator `from` to operator `to` (both uses of it;
  // wrapping into the next step when to < from) only reads it.
  bool only_reads_between(std::uint32_t ti, trace::OpIndex from, trace::OpIndex to) const {
    const trace::Tensor& t = in_.trace->tensors[ti];
    const std::size_t a = use_position(t, from), b = use_position(t, to);
    const std::uint32_t* w = writes_before_.data() + write_base_[ti];
    if (a <= b) return w[b + 1] == w[a];
    return w[t.uses.size()] - w[a] + w[b + 1] == 0;  // wraps: [a, end) and [0, b]
  }

  // The same tensor's period before (or after) period j: the step repeats, so a persistent
  // tensor's periods wrap around (its only period is its own neighbour); a step-local tensor's
  // first has none before it and its last none after it.
  std::optional<std::uint32_t> neighbour(std::uint32_t j, bool after) const {
    const std::uint32_t ti = periods_[j].tensor;
    const std::uint32_t begin = periods_begin_[ti], end = periods_begin_[ti + 1];
    const bool wraps = after ? j + 1 == end : j == begin;
    if (wraps && !in_.trace->tensors[ti].persistent) return std::nullopt;
    if (after) return wraps ? begin : j + 1;
    return wraps ? end - 1 : j - 1;
  }

  // How many periods tensor `ti` has: no walk through its neighbours needs more steps.
  std::uint32_t period_count(std::uint32_t ti) const { return periods_begin_[ti + 1] - periods_begin_[ti]; }

  // The period whose copy period `index` can reuse: the nearest earlier period of the same
  // tensor moved out and brought back (wrapping for persistent tensors), with only read-only
  // uses from its return to this period's start. A persistent tensor that is never written
  // (a frozen weight) reuses the copy its own period made a step before.
  std::optional<std::uint32_t> copy_source(std::uint32_t index) const {
    const trace::InactivePeriod& p = periods_[index];
    const trace::Tensor& t = in_.trace->tensors[p.tensor];
    if (t.read_only_uses.empty()) return std::nullopt;
    std::optional<std::uint32_t> j = index;
    for (std::uint32_t seen = 0; seen < period_count(p.tensor); ++seen) {
      j = neighbour(*j, false);
      if (!j) return std::nullopt;
      const trace::InactivePeriod& q = periods_[*j];
      if (q.released || !only_reads_between(p.tensor, q.next_use, p.last_use)) return std::nullopt;
      if (accepted_at_[*j] != kNone) return j;
    }
    if (t.persistent && t.read_only_uses.size() == t.uses.size()) return index;
    return std::nullopt;
  }

  // The resident stretch between a source period's return and period `index`'s start, as a
  // window: the kept copy occupies its tier there too.
  Window kept_stretch(std::uint32_t source, std::uint32_t index) const {
    const std::size_t from = periods_[source].next_use, to = periods_[index].last_use;
    return {from, (to + n_ - from) % n_ + 1};
  }

  std::optional<Choice> evaluate_clean(std::uint32_t index) {
    const std::optional<std::uint32_t> source = copy_source(index);
    if (!source) return std::nullopt;
    if (accepted_at_[*source] != kNone)
      return evaluate_clean_tier(index, *source, accepted_[accepted_at_[*source]].choice.tier);
    if (auto c = evaluate_clean_tier(index, *source, Tier::kSsd)) return c;
    return evaluate_clean_tier(index, *source, Tier::kHost);
  }

  std::optional<Choice> evaluate_clean_tier(std::uint32_t index, std::uint32_t source, Tier tier) {
    const trace::InactivePeriod& p = periods_[index];
    const Route pre = prefetch_route(tier);
    if (!ledger_.usable(pre) || !ledger_.usable(offload_route(tier))) return std::nullopt;
    if (tier == Tier::kSsd && !tier_has_room(p, tier)) return std::nullopt;
    const Window w = window_of(p);
    const auto s = static_cast<double>(bytes_of(p));
    const std::size_t first = p.released ? w.length : ledger_.latest_start(pre, w, 1, s + request_bytes(pre));
    if (first == kNotFound) return std::nullopt;
    const DemandTree::Summary over = demand_over(w, 0, first);
    if (over.over_weight <= 0) return std::nullopt;
    if (tier == Tier::kHost) {
      if (in_.hardware.host_capacity == 0) return std::nullopt;
      std::int64_t peak = 0;
      for (const Window part : {w, kept_stretch(source, index)})
        for (const Segment& seg : segments(n_, part, 0, part.length))
          peak = std::max(peak, host_.max(seg.op_begin, seg.op_end));
      // Kept copies are a saving the plan may forgo: they leave a tenth of the host tier to the
      // evictions the plan does not foresee (reactive ones must always find room).
      if (static_cast<std::uint64_t>(peak) + bytes_of(p) > in_.hardware.host_capacity / 10 * 9)
        return std::nullopt;
    }
    return choice(tier, 0, first, over, s, true);
  }

  // After period `index` is accepted, the tensor's later periods up to its next write may
  // reuse its copy: their stored scores (made without it) are too low, so they are scored again.
  template <typename Queue>
  void rescore_followers(std::uint32_t index, Queue& queue) {
    const trace::InactivePeriod& p = periods_[index];
    const trace::Tensor& t = in_.trace->tensors[p.tensor];
    if (t.read_only_uses.empty() || p.released) return;
    std::optional<std::uint32_t> j = index;
    for (std::uint32_t seen = 1; seen < period_count(p.tensor); ++seen) {
      j = neighbour(*j, true);
      if (!j) return;
      const trace::InactivePeriod& q = periods_[*j];
      if (!only_reads_between(p.tensor, p.next_use, q.last_use)) return;
      if (accepted_at_[*j] != kNone) return;
      if (!movable(q, bytes_of(q), smallest_)) continue;
      if (auto c = evaluate(*j)) queue.push({c->score, t.id, q.last_use, *j});
    }
  }

  // Each accepted period whose tensor's next accepted period is clean keeps its tier copy.
  void mark_kept_copies() {
    for (Accepted& a : accepted_) {
      const trace::InactivePeriod& p = periods_[a.period];
      if (p.released) continue;
      std::optional<std::uint32_t> j = a.period;
      for (std::uint32_t seen = 0; seen < period_count(p.tensor); ++seen) {
        j = neighbour(*j, true);
        if (!j) break;
        if (accepted_at_[*j] == kNone) continue;
        // On another tier the copy would not be where the clean period's prefetch reads it.
        const Choice& next = accepted_[accepted_at_[*j]].choice;
        a.keeps_copy = next.clean && next.tier == a.choice.tier;
        break;
      }
    }
  }

  void accept(std::uint32_t index, const Choice& c) {
    const trace::InactivePeriod& p = periods_[index];
    const Window w = window_of(p);
    const std::uint64_t s = bytes_of(p);
    const Route off = offload_route(c.tier);
    const Route pre = prefetch_route(c.tier);
    if (!c.clean) ledger_.book_forward(off, w, c.offload_last, static_cast<double>(s) + request_bytes(off));
    if (!p.released)
      ledger_.book_backward(pre, w, c.prefetch_booked, static_cast<double>(s) + request_bytes(pre));
    // A dropped copy frees its memory at once; a copied one once the copy out is done.
    demand_add(w, c.clean ? 0 : c.offload_last + 1, c.prefetch_booked, -static_cast<std::int64_t>(s));
    if (c.tier == Tier::kHost) {
      // The host copy exists from the offload's issue to the prefetch's completion, and for a
      // clean period also while the tensor was back on the device before it.
      for (const Segment& seg : segments(n_, w, 0, w.length))
        host_.add(seg.op_begin, seg.op_end, static_cast<std::int64_t>(s));
      if (c.clean) {
        if (const std::optional<std::uint32_t> source = copy_source(index)) {
          const Window stretch = kept_stretch(*source, index);
          for (const Segment& seg : segments(n_, stretch, 0, stretch.length))
            host_.add(seg.op_begin, seg.op_end, static_cast<std::int64_t>(s));
        }
      }
    } else if (!on_ssd_[p.tensor]) {
      on_ssd_[p.tensor] = true;
      ssd_used_ += s;
    }
    accepted_at_[index] = static_cast<std::uint32_t>(accepted_.size());
    accepted_.push_back({index, c, false});
  }

  void select() {
    std::priority_queue<QueueEntry, std::vector<QueueEntry>, QueueOrder> queue;
    if (demand_.max() <= budget_) return;
    for (std::uint32_t i = 0; i < periods_.size(); ++i) {
      const trace::InactivePeriod& p = periods_[i];
      if (!movable(p, bytes_of(p), smallest_)) continue;
      if (auto c = evaluate(i)) queue.push({c->score, in_.trace->tensors[p.tensor].id, p.last_use, i});
    }
    // Lazy re-evaluation: scores only fall as memory drops and bandwidth is booked, so a
    // popped candidate whose fresh score still beats the next stored one is the best (up
    // to the tolerance).
    while (demand_.max() > budget_ && !queue.empty()) {
      QueueEntry top = queue.top();
      queue.pop();
      if (accepted_at_[top.period] != kNone) continue;  // a rescored duplicate
      const std::optional<Choice> c = evaluate(top.period);
      if (!c) continue;
      if (!queue.empty() && c->score < queue.top().score * (1 - in_.options.score_tolerance)) {
        top.score = c->score;
        queue.push(top);
        continue;
      }
      accept(top.period, *c);
      rescore_followers(top.period, queue);
    }
  }

  double time_at(Window w, std::size_t offset) const { return detail::time_at(in_.start_s, w, offset); }

  // Smallest offset in [lo, hi] whose start is at or after `time` (hi when none is).
  std::size_t offset_at_or_after(Window w, std::size_t lo, std::size_t hi, double time) const {
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (time_at(w, mid) >= time)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }

  double transfer_s(const trace::InactivePeriod& p, Tier tier) const {
    return static_cast<double>(bytes_of(p)) / ledger_.rate(prefetch_route(tier)) +
           in_.hardware.request_latency_s;
  }

  void move_prefetches_earlier() {
    std::vector<std::size_t> order(accepted_.size());
    std::vector<double> slack(accepted_.size());
    for (std::size_t i = 0; i < accepted_.size(); ++i) {
      order[i] = i;
      const trace::InactivePeriod& p = periods_[accepted_[i].period];
      const Choice& c = accepted_[i].choice;
      slack[i] = p.released ? 0 : p.idle_s - time_at(window_of(p), c.prefetch_issue) - transfer_s(p, c.tier);
    }
    // Tightest prefetches first: they get the first pick of the memory headroom.
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (slack[a] != slack[b]) return slack[a] < slack[b];
      return accepted_[a].period < accepted_[b].period;
    });
    for (std::size_t i : order) {
      Choice& c = accepted_[i].choice;
      const trace::InactivePeriod& p = periods_[accepted_[i].period];
      if (p.released) continue;  // nothing comes back
      const Window w = window_of(p);
      const std::uint64_t s = bytes_of(p);
      const double earliest =
          time_at(w, c.prefetch_issue) - in_.options.early_prefetch_lead * transfer_s(p, c.tier);
      const std::size_t lo = offset_at_or_after(w, c.offload_last + 2, c.prefetch_issue, earliest);
      if (lo >= c.prefetch_issue) continue;
      // The prefetch may start right after the last operator in [lo, issue) that has no room for it.
      const std::int64_t bound = budget_ - static_cast<std::int64_t>(s);
      std::size_t blocked = kNotFound;
      const Segments segs = segments(n_, w, lo, c.prefetch_issue);
      for (std::size_t k = segs.count; k-- > 0 && blocked == kNotFound;) {
        const Segment& seg = segs.items[k];
        const std::size_t op = demand_.last_above(seg.op_begin, seg.op_end, bound);
        if (op != kNotFound) blocked = seg.offset(op);
      }
      const std::size_t issue = blocked == kNotFound ? lo : blocked + 1;
      if (issue >= c.prefetch_issue) continue;
      demand_add(w, issue, c.prefetch_issue, static_cast<std::int64_t>(s));
      c.prefetch_issue = issue;
    }
  }

  const GreedyInput& in_;
  const std::vector<trace::InactivePeriod>& periods_;
  std::size_t n_;
  std::int64_t budget_;
  std::uint64_t smallest_;  // tensors below this stay where they are (min_migration_share)
  BandwidthLedger ledger_;
  DemandTree demand_;
  OccupancyTree host_;
  std::vector<bool> on_ssd_;  // by tensor index: an SSD extent is already reserved
  std::uint64_t ssd_used_ = 0;
  std::size_t evaluations_ = 0;
  std::vector<Accepted> accepted_;
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  std::vector<std::uint32_t> accepted_at_;    // by period: index into accepted_, or kNone
  std::vector<std::size_t> write_base_;       // by tensor: start of its slice of writes_before_
  std::vector<std::uint32_t> writes_before_;  // per use position: writes among earlier uses
  std::vector<std::uint32_t> periods_begin_;  // by tensor: its first period in periods_
};

}  // namespace

GreedyResult run_greedy(const GreedyInput& input) {
  return Greedy(input).run();
}

}  // namespace teraio::plan::detail
