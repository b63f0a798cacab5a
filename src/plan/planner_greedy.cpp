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
        ledger_(durations(in.start_s), in.hardware),
        demand_(in.demand, demand_weights(in.start_s), budget_),
        host_(n_),
        on_ssd_(in.trace->tensors.size(), false) {}

  GreedyResult run() {
    select();
    if (in_.options.early_prefetch) move_prefetches_earlier();
    GreedyResult out;
    out.accepted = std::move(accepted_);
    out.demand_after = demand_.values();
    out.host_peak = static_cast<std::uint64_t>(std::max<std::int64_t>(0, host_.max()));
    out.ssd_used = ssd_used_;
    out.evaluations = evaluations_;
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
    Choice c;
    c.tier = tier;
    c.offload_last = last;
    c.prefetch_booked = first;
    c.prefetch_issue = first;
    c.score = in_.options.credit_over_budget_only ? std::min(over.over_weight, over.over_excess / s)
                                                  : over.over_weight;
    if (!(c.score > 0)) return std::nullopt;
    return c;
  }

  // SSD first; host memory when the SSD routes cannot fit the period (or its space is used up).
  std::optional<Choice> evaluate(const trace::InactivePeriod& p) {
    ++evaluations_;
    if (auto c = evaluate_tier(p, Tier::kSsd)) return c;
    return evaluate_tier(p, Tier::kHost);
  }

  void accept(std::uint32_t index, const Choice& c) {
    const trace::InactivePeriod& p = periods_[index];
    const Window w = window_of(p);
    const std::uint64_t s = bytes_of(p);
    const Route off = offload_route(c.tier);
    const Route pre = prefetch_route(c.tier);
    ledger_.book_forward(off, w, c.offload_last, static_cast<double>(s) + request_bytes(off));
    if (!p.released)
      ledger_.book_backward(pre, w, c.prefetch_booked, static_cast<double>(s) + request_bytes(pre));
    demand_add(w, c.offload_last + 1, c.prefetch_booked, -static_cast<std::int64_t>(s));
    if (c.tier == Tier::kHost) {
      // The host copy exists from the offload's issue to the prefetch's completion.
      for (const Segment& seg : segments(n_, w, 0, w.length))
        host_.add(seg.op_begin, seg.op_end, static_cast<std::int64_t>(s));
    } else if (!on_ssd_[p.tensor]) {
      on_ssd_[p.tensor] = true;
      ssd_used_ += s;
    }
    accepted_.push_back({index, c});
  }

  void select() {
    std::priority_queue<QueueEntry, std::vector<QueueEntry>, QueueOrder> queue;
    if (demand_.max() <= budget_) return;
    for (std::uint32_t i = 0; i < periods_.size(); ++i) {
      const trace::InactivePeriod& p = periods_[i];
      // A tensor of 0 bytes frees nothing, and a migration of 0 bytes is not a valid plan entry.
      if (p.idle_ops < kMinIdleOps || bytes_of(p) == 0) continue;
      if (auto c = evaluate(p)) queue.push({c->score, in_.trace->tensors[p.tensor].id, p.last_use, i});
    }
    // Lazy re-evaluation: scores only fall as memory drops and bandwidth is booked, so a
    // popped candidate whose fresh score still beats the next stored one is the best (up
    // to the tolerance).
    while (demand_.max() > budget_ && !queue.empty()) {
      QueueEntry top = queue.top();
      queue.pop();
      const std::optional<Choice> c = evaluate(periods_[top.period]);
      if (!c) continue;
      if (!queue.empty() && c->score < queue.top().score * (1 - in_.options.score_tolerance)) {
        top.score = c->score;
        queue.push(top);
        continue;
      }
      accept(top.period, *c);
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
  BandwidthLedger ledger_;
  DemandTree demand_;
  OccupancyTree host_;
  std::vector<bool> on_ssd_;  // by tensor index: an SSD extent is already reserved
  std::uint64_t ssd_used_ = 0;
  std::size_t evaluations_ = 0;
  std::vector<Accepted> accepted_;
};

}  // namespace

GreedyResult run_greedy(const GreedyInput& input) {
  return Greedy(input).run();
}

}  // namespace teraio::plan::detail
