#include "teraio/io/extent_allocator.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/io/stripe_set.hpp"

namespace teraio::io {
namespace {

TEST(ExtentAllocator, AlignsAndNeverExceedsCapacity) {
  ExtentAllocator alloc(10 * kPageSize);
  auto a = alloc.allocate(1);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a % kPageSize, 0u);
  EXPECT_EQ(alloc.used(), kPageSize);
  auto b = alloc.allocate(9 * kPageSize);
  ASSERT_TRUE(b);
  EXPECT_EQ(alloc.used(), alloc.capacity());
  EXPECT_FALSE(alloc.allocate(1));
  EXPECT_FALSE(alloc.allocate(11 * kPageSize));
}

TEST(ExtentAllocator, ZeroBytesGetDistinctOffsets) {
  ExtentAllocator alloc(4 * kPageSize);
  auto a = alloc.allocate(0);
  auto b = alloc.allocate(0);
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  alloc.release(*a, 0);
  alloc.release(*b, 0);
  EXPECT_EQ(alloc.used(), 0u);
}

TEST(ExtentAllocator, CoalescesNeighboursOnRelease) {
  ExtentAllocator alloc(8 * kPageSize);
  std::vector<std::uint64_t> offsets;
  for (int i = 0; i < 8; ++i) offsets.push_back(*alloc.allocate(kPageSize));
  EXPECT_FALSE(alloc.allocate(1));
  // Release in an interleaved order so that both left and right merges happen.
  for (int i : {1, 3, 5, 7, 0, 2, 6, 4}) alloc.release(offsets[i], kPageSize);
  EXPECT_EQ(alloc.free_ranges(), 1u);
  EXPECT_EQ(alloc.largest_free(), 8 * kPageSize);
  EXPECT_TRUE(alloc.allocate(8 * kPageSize));
}

TEST(ExtentAllocator, BestFitKeepsLargeRangesWhole) {
  ExtentAllocator alloc(16 * kPageSize);
  auto a = *alloc.allocate(2 * kPageSize);
  auto b = *alloc.allocate(kPageSize);
  auto c = *alloc.allocate(8 * kPageSize);
  (void)b;
  alloc.release(a, 2 * kPageSize);  // a 2-page hole, plus 5 free pages at the end
  (void)c;
  auto d = alloc.allocate(2 * kPageSize);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, a);  // the exact hole, not the tail
  EXPECT_EQ(alloc.largest_free(), 5 * kPageSize);
}

TEST(ExtentAllocator, RejectsUnknownRelease) {
  ExtentAllocator alloc(4 * kPageSize);
  EXPECT_THROW(alloc.release(0, kPageSize), Error);
  auto a = *alloc.allocate(kPageSize);
  EXPECT_THROW(alloc.release(a, 2 * kPageSize), Error);
  alloc.release(a, kPageSize);
  EXPECT_THROW(alloc.release(a, kPageSize), Error);
}

TEST(ExtentAllocator, RandomChurnReusesSpaceWithoutGrowth) {
  ExtentAllocator alloc(1024 * kPageSize);
  std::mt19937 rng(7);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  for (int round = 0; round < 20000; ++round) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 200)) {
      const std::size_t i = rng() % live.size();
      alloc.release(live[i].first, live[i].second);
      live[i] = live.back();
      live.pop_back();
    } else {
      const std::uint64_t bytes = 1 + rng() % (16 * kPageSize);
      if (auto at = alloc.allocate(bytes)) live.emplace_back(*at, bytes);
    }
    ASSERT_LE(alloc.used(), alloc.capacity());
  }
  for (const auto& [offset, bytes] : live) alloc.release(offset, bytes);
  EXPECT_EQ(alloc.used(), 0u);
  EXPECT_EQ(alloc.free_ranges(), 1u);
}

TEST(StripeSet, SmallRangesGoWholeToTheLeastUsedPath) {
  StripeSet set({64 * kMiB, 64 * kMiB}, 4 * kMiB);
  auto a = set.allocate(kMiB);
  auto b = set.allocate(kMiB);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->pieces.size(), 1u);
  ASSERT_EQ(b->pieces.size(), 1u);
  EXPECT_NE(a->pieces[0].path, b->pieces[0].path);
}

TEST(StripeSet, LargeRangesAreDealtRoundRobin) {
  StripeSet set({64 * kMiB, 64 * kMiB, 64 * kMiB}, 4 * kMiB);
  const std::uint64_t bytes = 4 * kMiB * 7 + 123;  // not a multiple of the stripe
  auto layout = set.allocate(bytes);
  ASSERT_TRUE(layout);
  ASSERT_EQ(layout->pieces.size(), 8u);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < layout->pieces.size(); ++i) {
    const StripePiece& piece = layout->pieces[i];
    EXPECT_EQ(piece.logical_offset, i * 4 * kMiB);
    EXPECT_EQ(piece.path, (layout->pieces[0].path + i) % 3);
    EXPECT_EQ(piece.file_offset % kPageSize, 0u);
    total += piece.length;
  }
  EXPECT_EQ(total, bytes);
  EXPECT_EQ(layout->pieces.back().length, 123u);
  EXPECT_EQ(layout->reservations.size(), 3u);
  set.release(*layout);
  for (std::size_t p = 0; p < 3; ++p) EXPECT_EQ(set.used(p), 0u);
}

// The path with the most free space may hold it only in pieces: a range that fits whole on
// another path must go there, not be refused as "tier full".
TEST(StripeSet, FragmentedFreestPathHandsSmallRangesOn) {
  StripeSet set({64 * kKiB, 40 * kKiB}, 64 * kKiB);
  auto x1 = set.allocate(16 * kKiB);
  auto x2 = set.allocate(16 * kKiB);
  auto x3 = set.allocate(16 * kKiB);
  auto x4 = set.allocate(16 * kKiB);
  ASSERT_TRUE(x1 && x2 && x3 && x4);
  ASSERT_EQ(x2->reservations[0].path, 0u);
  ASSERT_EQ(x3->reservations[0].path, 1u);
  set.release(*x2);  // path 0: 32 KiB free in two 16 KiB holes; path 1: 24 KiB in one
  auto y = set.allocate(20 * kKiB);
  ASSERT_TRUE(y) << "20 KiB fits on path 1";
  EXPECT_EQ(y->reservations[0].path, 1u);
}

TEST(StripeSet, FullTierReservesNothing) {
  StripeSet set({8 * kMiB, 2 * kMiB}, kMiB);
  // Needs 5 MiB on path 0 and 5 MiB on path 1: path 1 cannot hold its share.
  EXPECT_FALSE(set.allocate(10 * kMiB));
  EXPECT_EQ(set.used(0), 0u);
  EXPECT_EQ(set.used(1), 0u);
}

TEST(StripeSet, RejectsUnalignedStripeUnit) {
  EXPECT_THROW(StripeSet({kMiB}, 1000), Error);
  EXPECT_THROW(StripeSet({kMiB}, 0), Error);
}

}  // namespace
}  // namespace teraio::io
