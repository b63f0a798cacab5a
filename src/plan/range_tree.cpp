#include "teraio/plan/range_tree.hpp"

#include <algorithm>

namespace teraio::plan {
namespace {

constexpr std::int64_t kNoOver = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kNoUnder = std::numeric_limits<std::int64_t>::min();
// Padding leaves sit far below any budget so that they never count as over it.
constexpr std::int64_t kPadding = std::numeric_limits<std::int64_t>::min() / 4;

std::size_t leaf_count(std::size_t n) {
  std::size_t leaves = 1;
  while (leaves < n) leaves *= 2;
  return leaves;
}

}  // namespace

// ---- CapacityTree ---------------------------------------------------------------------

CapacityTree::CapacityTree(const std::vector<double>& values)
    : n_(values.size()), leaves_(leaf_count(values.size())), sum_(2 * leaves_, 0.0) {
  for (std::size_t k = 0; k < n_; ++k) sum_[leaves_ + k] = std::max(0.0, values[k]);
  for (std::size_t node = leaves_ - 1; node >= 1; --node) sum_[node] = sum_[2 * node] + sum_[2 * node + 1];
}

void CapacityTree::set(std::size_t k, double value) {
  std::size_t node = leaves_ + k;
  sum_[node] = std::max(0.0, value);
  // Parents are recomputed from their children, never adjusted by deltas, so sums do not drift.
  for (node /= 2; node >= 1; node /= 2) sum_[node] = sum_[2 * node] + sum_[2 * node + 1];
}

double CapacityTree::sum(std::size_t l, std::size_t r) const {
  double total = 0;
  for (l += leaves_, r += leaves_; l < r; l /= 2, r /= 2) {
    if (l & 1) total += sum_[l++];
    if (r & 1) total += sum_[--r];
  }
  return total;
}

std::size_t CapacityTree::forward(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l,
                                  std::size_t r, double& need) const {
  if (nr <= l || r <= nl || sum_[node] <= 0) return kNotFound;
  if (l <= nl && nr <= r && sum_[node] < need) {
    need -= sum_[node];
    return kNotFound;
  }
  if (nr - nl == 1) return nl;
  const std::size_t mid = (nl + nr) / 2;
  const std::size_t found = forward(2 * node, nl, mid, l, r, need);
  return found != kNotFound ? found : forward(2 * node + 1, mid, nr, l, r, need);
}

std::size_t CapacityTree::backward(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l,
                                   std::size_t r, double& need) const {
  if (nr <= l || r <= nl || sum_[node] <= 0) return kNotFound;
  if (l <= nl && nr <= r && sum_[node] < need) {
    need -= sum_[node];
    return kNotFound;
  }
  if (nr - nl == 1) return nl;
  const std::size_t mid = (nl + nr) / 2;
  const std::size_t found = backward(2 * node + 1, mid, nr, l, r, need);
  return found != kNotFound ? found : backward(2 * node, nl, mid, l, r, need);
}

std::size_t CapacityTree::find_forward(std::size_t l, std::size_t r, double need) const {
  if (l >= r) return kNotFound;
  if (need <= 0) return l;
  return forward(1, 0, leaves_, l, std::min(r, n_), need);
}

std::size_t CapacityTree::find_backward(std::size_t l, std::size_t r, double need) const {
  r = std::min(r, n_);
  if (l >= r) return kNotFound;
  if (need <= 0) return r - 1;
  return backward(1, 0, leaves_, l, r, need);
}

std::size_t CapacityTree::walk_forward(std::size_t l, std::size_t r, double& need) const {
  r = std::min(r, n_);
  if (l >= r) return kNotFound;
  if (need <= 0) return l;
  return forward(1, 0, leaves_, l, r, need);
}

std::size_t CapacityTree::walk_backward(std::size_t l, std::size_t r, double& need) const {
  r = std::min(r, n_);
  if (l >= r) return kNotFound;
  if (need <= 0) return r - 1;
  return backward(1, 0, leaves_, l, r, need);
}

std::size_t CapacityTree::first_positive(std::size_t l, std::size_t r) const {
  return find_forward(l, r, std::numeric_limits<double>::min());
}

std::size_t CapacityTree::last_positive(std::size_t l, std::size_t r) const {
  return find_backward(l, r, std::numeric_limits<double>::min());
}

// ---- DemandTree -----------------------------------------------------------------------

DemandTree::DemandTree(const std::vector<std::int64_t>& demand, const std::vector<double>& weight,
                       std::int64_t budget)
    : n_(demand.size()), leaves_(leaf_count(demand.size())), budget_(budget), weight_(leaves_, 0.0) {
  node_.resize(2 * leaves_);
  for (std::size_t k = 0; k < leaves_; ++k) {
    if (k < n_) weight_[k] = weight[k];
    set_leaf(leaves_ + k, k < n_ ? demand[k] : kPadding);
  }
  for (std::size_t node = leaves_ - 1; node >= 1; --node) pull(node);
}

void DemandTree::set_leaf(std::size_t node, std::int64_t value) {
  Node& leaf = node_[node];
  const double w = weight_[node - leaves_];
  leaf.max = value;
  leaf.lazy = 0;
  if (value > budget_) {
    leaf.min_over = value;
    leaf.max_under = kNoUnder;
    leaf.over_weight = w;
    leaf.over_excess = w * static_cast<double>(value - budget_);
  } else {
    leaf.min_over = kNoOver;
    leaf.max_under = value;
    leaf.over_weight = 0;
    leaf.over_excess = 0;
  }
}

bool DemandTree::can_apply(const Node& node, std::int64_t delta) const {
  if (delta < 0) return node.min_over == kNoOver || node.min_over + delta > budget_;
  return node.max_under == kNoUnder || node.max_under + delta <= budget_;
}

void DemandTree::apply(std::size_t node, std::int64_t delta) {
  Node& x = node_[node];
  x.max += delta;
  if (x.min_over != kNoOver) x.min_over += delta;
  if (x.max_under != kNoUnder) x.max_under += delta;
  x.over_excess += static_cast<double>(delta) * x.over_weight;
  x.lazy += delta;
}

void DemandTree::push(std::size_t node) {
  if (node_[node].lazy == 0) return;
  apply(2 * node, node_[node].lazy);
  apply(2 * node + 1, node_[node].lazy);
  node_[node].lazy = 0;
}

void DemandTree::pull(std::size_t node) {
  const Node& a = node_[2 * node];
  const Node& b = node_[2 * node + 1];
  Node& x = node_[node];
  x.max = std::max(a.max, b.max);
  x.min_over = std::min(a.min_over, b.min_over);
  x.max_under = std::max(a.max_under, b.max_under);
  x.over_weight = a.over_weight + b.over_weight;
  x.over_excess = a.over_excess + b.over_excess;
}

void DemandTree::add(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
                     std::int64_t delta) {
  if (nr <= l || r <= nl) return;
  if (nr - nl == 1) {
    set_leaf(node, node_[node].max + delta);
    return;
  }
  // A node where some operator crosses the budget cannot take the add lazily: its
  // over-budget aggregates change shape, so descend to the operators that cross.
  if (l <= nl && nr <= r && can_apply(node_[node], delta)) {
    apply(node, delta);
    return;
  }
  push(node);
  const std::size_t mid = (nl + nr) / 2;
  add(2 * node, nl, mid, l, r, delta);
  add(2 * node + 1, mid, nr, l, r, delta);
  pull(node);
}

void DemandTree::add(std::size_t l, std::size_t r, std::int64_t delta) {
  r = std::min(r, n_);
  if (l >= r || delta == 0) return;
  add(1, 0, leaves_, l, r, delta);
}

void DemandTree::query(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
                       Summary& out) {
  if (nr <= l || r <= nl) return;
  if (l <= nl && nr <= r) {
    out.max = std::max(out.max, node_[node].max);
    out.over_weight += node_[node].over_weight;
    out.over_excess += node_[node].over_excess;
    return;
  }
  push(node);
  const std::size_t mid = (nl + nr) / 2;
  query(2 * node, nl, mid, l, r, out);
  query(2 * node + 1, mid, nr, l, r, out);
}

DemandTree::Summary DemandTree::query(std::size_t l, std::size_t r) {
  Summary out;
  r = std::min(r, n_);
  if (l < r) query(1, 0, leaves_, l, r, out);
  return out;
}

std::size_t DemandTree::last_above(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l,
                                   std::size_t r, std::int64_t bound) {
  if (nr <= l || r <= nl || node_[node].max <= bound) return kNotFound;
  if (nr - nl == 1) return nl;
  push(node);
  const std::size_t mid = (nl + nr) / 2;
  const std::size_t found = last_above(2 * node + 1, mid, nr, l, r, bound);
  return found != kNotFound ? found : last_above(2 * node, nl, mid, l, r, bound);
}

std::size_t DemandTree::last_above(std::size_t l, std::size_t r, std::int64_t bound) {
  r = std::min(r, n_);
  if (l >= r) return kNotFound;
  return last_above(1, 0, leaves_, l, r, bound);
}

std::vector<std::int64_t> DemandTree::values() {
  for (std::size_t node = 1; node < leaves_; ++node) push(node);
  std::vector<std::int64_t> out(n_);
  for (std::size_t k = 0; k < n_; ++k) out[k] = node_[leaves_ + k].max;
  return out;
}

// ---- OccupancyTree --------------------------------------------------------------------

OccupancyTree::OccupancyTree(std::size_t n)
    : n_(n), leaves_(leaf_count(n)), max_(2 * leaves_, 0), lazy_(2 * leaves_, 0) {}

void OccupancyTree::add(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
                        std::int64_t delta) {
  if (nr <= l || r <= nl) return;
  if (l <= nl && nr <= r) {
    max_[node] += delta;
    lazy_[node] += delta;
    return;
  }
  const std::size_t mid = (nl + nr) / 2;
  add(2 * node, nl, mid, l, r, delta);
  add(2 * node + 1, mid, nr, l, r, delta);
  max_[node] = std::max(max_[2 * node], max_[2 * node + 1]) + lazy_[node];
}

void OccupancyTree::add(std::size_t l, std::size_t r, std::int64_t delta) {
  r = std::min(r, n_);
  if (l < r) add(1, 0, leaves_, l, r, delta);
}

std::int64_t OccupancyTree::max(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l,
                                std::size_t r) const {
  if (nr <= l || r <= nl) return std::numeric_limits<std::int64_t>::min();
  if (l <= nl && nr <= r) return max_[node];
  const std::size_t mid = (nl + nr) / 2;
  return std::max(max(2 * node, nl, mid, l, r), max(2 * node + 1, mid, nr, l, r)) + lazy_[node];
}

std::int64_t OccupancyTree::max(std::size_t l, std::size_t r) const {
  r = std::min(r, n_);
  if (l >= r) return 0;
  return max(1, 0, leaves_, l, r);
}

}  // namespace teraio::plan
