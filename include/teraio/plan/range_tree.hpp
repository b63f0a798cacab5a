// plan/range_tree: the segment trees over operators that make each greedy round of the
// planner cost O(log n) instead of a rescan: free channel capacity (sums with "walk until
// enough bytes are covered" descents), memory demand (range add with range max and the
// over-budget memory-time of a window), and tier occupancy (range add, range max).
// Ranges are half-open [l, r) over leaf indices; npos means "not found".
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace teraio::plan {

inline constexpr std::size_t kNotFound = std::numeric_limits<std::size_t>::max();

// Non-negative capacities (bytes a channel can still carry during each operator).
class CapacityTree {
 public:
  explicit CapacityTree(const std::vector<double>& values);

  std::size_t size() const { return n_; }
  double get(std::size_t k) const { return sum_[leaves_ + k]; }
  // Negative values are stored as 0 (rounding in callers' subtractions).
  void set(std::size_t k, double value);
  double sum(std::size_t l, std::size_t r) const;
  // Smallest e in [l, r) with sum(l, e + 1) >= need, or kNotFound.
  std::size_t find_forward(std::size_t l, std::size_t r, double need) const;
  // Largest p in [l, r) with sum(p, r) >= need, or kNotFound.
  std::size_t find_backward(std::size_t l, std::size_t r, double need) const;
  // The same walks in one pass for callers chaining ranges: when not found, `need` is left
  // reduced by the range's whole capacity, ready for the next range.
  std::size_t walk_forward(std::size_t l, std::size_t r, double& need) const;
  std::size_t walk_backward(std::size_t l, std::size_t r, double& need) const;
  // First k in [l, r) with a positive value, or kNotFound.
  std::size_t first_positive(std::size_t l, std::size_t r) const;
  // Last k in [l, r) with a positive value, or kNotFound.
  std::size_t last_positive(std::size_t l, std::size_t r) const;

 private:
  std::size_t forward(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
                      double& need) const;
  std::size_t backward(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
                       double& need) const;

  std::size_t n_ = 0;
  std::size_t leaves_ = 1;
  std::vector<double> sum_;
};

// Memory demand per operator with a fixed budget: range add, range max, and for a window
// the time-weighted over-budget share, Σ w[k]·(M[k] − budget) over operators above budget.
// Each operator crosses the budget at most a few times in the planner's use (demand only
// falls, except in the early-prefetch pass which never crosses), so updates that cross it
// descend to the leaves and everything else is lazy: O(log n) amortized.
class DemandTree {
 public:
  DemandTree(const std::vector<std::int64_t>& demand, const std::vector<double>& weight, std::int64_t budget);

  struct Summary {
    std::int64_t max = std::numeric_limits<std::int64_t>::min();
    double over_weight = 0;  // Σ w over operators above budget
    double over_excess = 0;  // Σ w·(M − budget) over operators above budget
  };

  std::size_t size() const { return n_; }
  std::int64_t budget() const { return budget_; }
  std::int64_t max() const { return n_ == 0 ? 0 : node_[1].max; }
  Summary query(std::size_t l, std::size_t r);
  void add(std::size_t l, std::size_t r, std::int64_t delta);
  // Last k in [l, r) whose demand exceeds `bound`, or kNotFound.
  std::size_t last_above(std::size_t l, std::size_t r, std::int64_t bound);
  std::vector<std::int64_t> values();

 private:
  struct Node {
    std::int64_t max;
    std::int64_t min_over;   // smallest demand above budget (int64 max when none)
    std::int64_t max_under;  // largest demand at or below budget (int64 min when none)
    std::int64_t lazy;
    double over_weight;
    double over_excess;
  };
  void set_leaf(std::size_t node, std::int64_t value);
  bool can_apply(const Node& node, std::int64_t delta) const;
  void apply(std::size_t node, std::int64_t delta);
  void push(std::size_t node);
  void pull(std::size_t node);
  void add(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
           std::int64_t delta);
  void query(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r, Summary& out);
  std::size_t last_above(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
                         std::int64_t bound);

  std::size_t n_ = 0;
  std::size_t leaves_ = 1;
  std::int64_t budget_ = 0;
  std::vector<double> weight_;
  std::vector<Node> node_;
};

// Occupancy of a tier over operators: range add, range max.
class OccupancyTree {
 public:
  explicit OccupancyTree(std::size_t n);

  std::int64_t max(std::size_t l, std::size_t r) const;
  std::int64_t max() const { return max_[1]; }
  void add(std::size_t l, std::size_t r, std::int64_t delta);

 private:
  void add(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r,
           std::int64_t delta);
  std::int64_t max(std::size_t node, std::size_t nl, std::size_t nr, std::size_t l, std::size_t r) const;

  std::size_t n_ = 0;
  std::size_t leaves_ = 1;
  std::vector<std::int64_t> max_;   // including this node's own pending add
  std::vector<std::int64_t> lazy_;  // added to the whole subtree, not yet in the children
};

}  // namespace teraio::plan
