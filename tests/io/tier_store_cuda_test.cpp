// The tier store with the CUDA copier: device memory through the host tier and through the
// bounce path (or cuFile where GDS registration works) to the SSD tier, with odd sizes and
// checksums. Runs on the GPU machine; skips where no CUDA device is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "io_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::io {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::TempDir;

std::unique_ptr<DeviceCopier> cuda_copier_or_null() {
  if (!cuda_compiled_in() || cuda_inventory().devices.empty()) return nullptr;
  return make_cuda_copier(0);
}

class DeviceMemory {
 public:
  DeviceMemory(DeviceCopier& copier, std::size_t n) : copier_(copier), data_(copier.allocate_device(n)) {}
  ~DeviceMemory() { copier_.free_device(data_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* data() const { return data_; }

 private:
  DeviceCopier& copier_;
  void* data_;
};

TEST(TierStoreCuda, DeviceMemoryRoundTripsThroughBothTiers) {
  auto copier = cuda_copier_or_null();
  if (!copier) GTEST_SKIP() << "no CUDA device: " << cuda_inventory().detail;
  for (bool checksums : {false, true}) {
    TempDir a, b;
    EngineConfig config;
    config.host_capacity = 64 * kMiB;
    config.ssd_paths = {a.path(), b.path()};
    config.ssd_capacity_per_path = 64 * kMiB;
    config.stripe_unit = 1 * kMiB;
    config.chunk_bytes = 256 * kKiB;
    config.bounce_pool_bytes = 4 * kMiB;
    config.checksums = checksums;
    TierStore store(*copier, config);
    std::printf("%s", format_report(store.report()).c_str());
    for (std::uint64_t n : std::vector<std::uint64_t>{1, 199, 4095, 4097, 3 * kMiB + 17, 20 * kMiB}) {
      for (TierKind tier : {TierKind::kHost, TierKind::kSsd}) {
        SCOPED_TRACE(::testing::Message() << to_string(tier) << " " << n << " checksums=" << checksums);
        const auto expected = pattern(n, static_cast<std::uint32_t>(n));
        std::vector<std::byte> back(n);
        DeviceMemory src(*copier, n);
        DeviceMemory dst(*copier, n);
        copier->to_device(src.data(), expected.data(), n)->wait();
        auto extent = store.allocate(tier, n);
        ASSERT_TRUE(extent);
        const Transfer w = store.write(*extent, src.data(), MemoryKind::kDevice, "cuda-test");
        ASSERT_TRUE(w.wait_for(60s));
        w.wait();
        const Transfer r = store.read(*extent, dst.data(), MemoryKind::kDevice);
        ASSERT_TRUE(r.wait_for(60s));
        r.wait();
        copier->to_host(back.data(), dst.data(), n)->wait();
        ASSERT_EQ(back, expected);
        store.release(*extent);
      }
    }
    for (const PathReport& path : store.report().paths) EXPECT_FALSE(path.cufile_detail.empty());
  }
}

}  // namespace
}  // namespace teraio::io
