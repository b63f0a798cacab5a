#include "teraio/io/pinned_pool.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <set>

#include "teraio/core/units.hpp"
#include "teraio/io/host_tier.hpp"

namespace teraio::io {
namespace {

using namespace std::chrono_literals;

// Counts pin/unpin calls on top of the host copier, to prove memory is pinned once.
class CountingCopier final : public DeviceCopier {
 public:
  std::string name() const override { return "counting"; }
  bool is_cuda() const override { return false; }
  std::unique_ptr<CopyEvent> to_host(void* d, const void* s, std::size_t n, CopyPriority) override {
    return host_->to_host(d, s, n);
  }
  std::unique_ptr<CopyEvent> to_device(void* d, const void* s, std::size_t n, CopyPriority) override {
    return host_->to_device(d, s, n);
  }
  void pin(void*, std::size_t n) override {
    ++pins;
    pinned_bytes += n;
  }
  void unpin(void*) override { ++unpins; }
  void* allocate_device(std::size_t n) override { return host_->allocate_device(n); }
  void free_device(void* p) override { host_->free_device(p); }

  int pins = 0;
  int unpins = 0;
  std::size_t pinned_bytes = 0;

 private:
  std::unique_ptr<DeviceCopier> host_ = make_host_copier();
};

TEST(PinnedBufferPool, HandsOutAlignedBuffersUpToTheCapAndReusesThem) {
  CountingCopier copier;
  {
    PinnedBufferPool pool(copier, 10000, 3 * 12288);
    EXPECT_EQ(pool.buffer_bytes(), 12288u);
    EXPECT_EQ(pool.buffer_count(), 3u);
    EXPECT_EQ(copier.pins, 1);
    std::set<std::byte*> seen;
    {
      auto a = pool.acquire();
      auto b = pool.acquire();
      auto c = pool.acquire();
      for (auto* buffer : {&a, &b, &c}) {
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer->data()) % kPageSize, 0u);
        std::memset(buffer->data(), 0xab, buffer->size());
        seen.insert(buffer->data());
      }
      EXPECT_EQ(seen.size(), 3u);
      EXPECT_FALSE(pool.try_acquire());
    }
    EXPECT_EQ(pool.available(), 3u);
    for (int round = 0; round < 100; ++round) {
      auto buffer = pool.acquire();
      EXPECT_TRUE(seen.count(buffer.data()));  // no growth: always one of the same three
    }
    EXPECT_EQ(copier.pins, 1);
  }
  EXPECT_EQ(copier.unpins, 1);
}

TEST(PinnedBufferPool, AcquireBlocksUntilABufferIsReturned) {
  CountingCopier copier;
  PinnedBufferPool pool(copier, kPageSize, kPageSize);
  auto held = std::make_unique<PinnedBuffer>(pool.acquire());
  auto waiter = std::async(std::launch::async, [&] { return pool.acquire().data(); });
  EXPECT_EQ(waiter.wait_for(50ms), std::future_status::timeout);
  std::byte* data = held->data();
  held.reset();
  ASSERT_EQ(waiter.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(waiter.get(), data);
}

TEST(PinnedBufferPool, MovedHandleReturnsOnce) {
  CountingCopier copier;
  PinnedBufferPool pool(copier, kPageSize, 2 * kPageSize);
  {
    PinnedBuffer a = pool.acquire();
    PinnedBuffer b = std::move(a);
    EXPECT_FALSE(a);
    EXPECT_TRUE(b);
    PinnedBuffer c = pool.acquire();
    c = std::move(b);  // c's first buffer goes back now
    EXPECT_EQ(pool.available(), 1u);
  }
  EXPECT_EQ(pool.available(), 2u);
}

TEST(HostTier, HardCapacityTierFullAndReuseWithoutGrowth) {
  CountingCopier copier;
  HostTier tier(copier, 64 * kPageSize, /*pin_in_background=*/true);
  tier.wait_pinned();
  EXPECT_EQ(copier.pins, 1);
  EXPECT_EQ(copier.pinned_bytes, 64 * kPageSize);
  for (int iteration = 0; iteration < 50; ++iteration) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
    for (std::uint64_t bytes : {kPageSize * 10 + 1, kPageSize * 20, std::uint64_t{199}, kPageSize * 30}) {
      auto offset = tier.allocate(bytes);
      if (!offset) {
        // 11 + 20 + 1 + 30 = 62 pages fit in 64; nothing else should be refused.
        FAIL() << "tier full at " << bytes;
      }
      std::memset(tier.data(*offset), iteration, bytes);
      live.emplace_back(*offset, bytes);
    }
    EXPECT_FALSE(tier.allocate(3 * kPageSize)) << "must report tier full beyond the cap";
    EXPECT_LE(tier.used(), tier.capacity());
    for (auto [offset, bytes] : live) tier.release(offset, bytes);
    EXPECT_EQ(tier.used(), 0u);
  }
  EXPECT_EQ(copier.pins, 1) << "the arena is pinned once, never per iteration";
}

TEST(HostTier, EmptyTierRefusesEverything) {
  CountingCopier copier;
  HostTier tier(copier, 0, false);
  tier.wait_pinned();
  EXPECT_FALSE(tier.allocate(1));
  EXPECT_EQ(copier.pins, 0);
}

}  // namespace
}  // namespace teraio::io
