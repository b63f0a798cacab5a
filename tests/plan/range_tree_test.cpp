#include "teraio/plan/range_tree.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace teraio::plan {
namespace {

TEST(CapacityTree, FindsWhereCumulativeCapacityCoversANeed) {
  CapacityTree tree({1, 0, 2, 3, 0, 4});
  EXPECT_DOUBLE_EQ(tree.sum(0, 6), 10);
  EXPECT_EQ(tree.find_forward(0, 6, 1), 0u);
  EXPECT_EQ(tree.find_forward(0, 6, 1.5), 2u);
  EXPECT_EQ(tree.find_forward(1, 6, 5), 3u);
  EXPECT_EQ(tree.find_forward(0, 6, 11), kNotFound);
  EXPECT_EQ(tree.find_backward(0, 6, 4), 5u);
  EXPECT_EQ(tree.find_backward(0, 6, 5), 3u);
  EXPECT_EQ(tree.find_backward(0, 5, 5), 2u);
  EXPECT_EQ(tree.first_positive(1, 6), 2u);
  EXPECT_EQ(tree.last_positive(0, 5), 3u);
  tree.set(3, -1);  // rounding below zero is stored as empty
  EXPECT_EQ(tree.get(3), 0);
  EXPECT_EQ(tree.find_forward(1, 6, 5), 5u);
}

TEST(CapacityTree, MatchesBruteForceOnRandomData) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(0, 5);
  for (int round = 0; round < 20; ++round) {
    const std::size_t n = 1 + rng() % 70;
    std::vector<double> v(n);
    for (double& x : v) x = value(rng) == 0 ? 0 : value(rng);
    CapacityTree tree(v);
    for (int q = 0; q < 200; ++q) {
      const std::size_t l = rng() % n;
      const std::size_t r = l + 1 + rng() % (n - l);
      const double need = value(rng) * 1.5 + 0.5;
      std::size_t expect_fwd = kNotFound, expect_bwd = kNotFound;
      double acc = 0;
      for (std::size_t k = l; k < r && expect_fwd == kNotFound; ++k)
        if ((acc += v[k]) >= need) expect_fwd = k;
      acc = 0;
      for (std::size_t k = r; k-- > l && expect_bwd == kNotFound;)
        if ((acc += v[k]) >= need) expect_bwd = k;
      ASSERT_EQ(tree.find_forward(l, r, need), expect_fwd) << l << " " << r << " " << need;
      ASSERT_EQ(tree.find_backward(l, r, need), expect_bwd) << l << " " << r << " " << need;
      const std::size_t k = rng() % n;
      v[k] = value(rng);
      tree.set(k, v[k]);
    }
  }
}

TEST(DemandTree, TracksMaxAndOverBudgetMemoryTime) {
  std::mt19937 rng(11);
  for (int round = 0; round < 20; ++round) {
    const std::size_t n = 1 + rng() % 60;
    const std::int64_t budget = 50;
    std::vector<std::int64_t> m(n);
    std::vector<double> w(n);
    for (std::size_t k = 0; k < n; ++k) {
      m[k] = static_cast<std::int64_t>(rng() % 100);
      w[k] = 1 + static_cast<double>(rng() % 4);
    }
    DemandTree tree(m, w, budget);
    for (int q = 0; q < 300; ++q) {
      const std::size_t l = rng() % n;
      const std::size_t r = l + 1 + rng() % (n - l);
      if (rng() % 2) {
        // Mostly decreases (as in planning), some increases that stay under budget.
        std::int64_t delta = -static_cast<std::int64_t>(rng() % 20);
        if (rng() % 4 == 0) {
          const std::int64_t room = budget - *std::max_element(m.begin() + l, m.begin() + r);
          delta = room > 0 ? static_cast<std::int64_t>(rng() % (room + 1)) : 0;
        }
        for (std::size_t k = l; k < r; ++k) m[k] += delta;
        tree.add(l, r, delta);
      }
      DemandTree::Summary expect;
      for (std::size_t k = l; k < r; ++k) {
        expect.max = std::max(expect.max, m[k]);
        if (m[k] > budget) {
          expect.over_weight += w[k];
          expect.over_excess += w[k] * static_cast<double>(m[k] - budget);
        }
      }
      const DemandTree::Summary got = tree.query(l, r);
      ASSERT_EQ(got.max, expect.max);
      ASSERT_NEAR(got.over_weight, expect.over_weight, 1e-9);
      ASSERT_NEAR(got.over_excess, expect.over_excess, 1e-6);
      const std::int64_t bound = static_cast<std::int64_t>(rng() % 100) - 20;
      std::size_t expect_last = kNotFound;
      for (std::size_t k = l; k < r; ++k)
        if (m[k] > bound) expect_last = k;
      ASSERT_EQ(tree.last_above(l, r, bound), expect_last);
    }
    EXPECT_EQ(tree.values(), m);
    EXPECT_EQ(tree.max(), *std::max_element(m.begin(), m.end()));
  }
}

TEST(OccupancyTree, RangeAddRangeMax) {
  std::mt19937 rng(3);
  const std::size_t n = 37;
  std::vector<std::int64_t> v(n, 0);
  OccupancyTree tree(n);
  for (int q = 0; q < 500; ++q) {
    const std::size_t l = rng() % n;
    const std::size_t r = l + 1 + rng() % (n - l);
    const std::int64_t delta = static_cast<std::int64_t>(rng() % 21) - 10;
    for (std::size_t k = l; k < r; ++k) v[k] += delta;
    tree.add(l, r, delta);
    const std::size_t a = rng() % n;
    const std::size_t b = a + 1 + rng() % (n - a);
    ASSERT_EQ(tree.max(a, b), *std::max_element(v.begin() + a, v.begin() + b));
  }
}

}  // namespace
}  // namespace teraio::plan
