// Micro-benchmarks of the storage engine's host side: the extent allocator under churn, tier
// store throughput (host tier; SSD tier on temporary directories under /tmp or
// TERAIO_BENCH_DIR) for each backend, with host and "device" (bounce path) memory, and the
// pause of a polling thread under the kernel's timer slack and the one TeraIO sets.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "teraio/core/timer_slack.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/extent_allocator.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::io {
namespace {

void BM_ExtentAllocatorChurn(benchmark::State& state) {
  ExtentAllocator alloc(64 * kGiB);
  std::mt19937_64 rng(1);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  const auto target = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    if (live.size() >= target || (!live.empty() && rng() % 2 == 0)) {
      const std::size_t i = rng() % live.size();
      alloc.release(live[i].first, live[i].second);
      live[i] = live.back();
      live.pop_back();
    } else {
      const std::uint64_t bytes = 1 + rng() % (64 * kMiB);
      if (auto at = alloc.allocate(bytes)) live.emplace_back(*at, bytes);
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ExtentAllocatorChurn)->Arg(100)->Arg(10000);

class BenchDir {
 public:
  BenchDir() {
    const char* base = std::getenv("TERAIO_BENCH_DIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/teraio-bench-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~BenchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Args: tier (0 host, 1 ssd), backend (0 posix, 1 io_uring), memory (0 host, 1 device), write (1) or read
// (0).
void BM_TierStore(benchmark::State& state) {
  const bool ssd = state.range(0) == 1;
  const auto backend = state.range(1) == 1 ? BackendChoice::kIoUring : BackendChoice::kPosix;
  const auto kind = state.range(2) == 1 ? MemoryKind::kDevice : MemoryKind::kHost;
  const bool write = state.range(3) == 1;
  if (backend == BackendChoice::kIoUring && !uring_compiled_in()) {
    state.SkipWithError("no io_uring in this build");
    return;
  }
  constexpr std::uint64_t kBytes = 64 * kMiB;
  BenchDir a, b;
  auto copier = make_host_copier();
  EngineConfig config;
  config.host_capacity = ssd ? 0 : kBytes;
  if (ssd) {
    config.ssd_paths = {a.path(), b.path()};
    config.ssd_capacity_per_path = kBytes;
  }
  config.backend = backend;
  TierStore store(*copier, config);
  void* memory = copier->allocate_device(kBytes);
  std::memset(memory, 7, kBytes);
  auto extent = *store.allocate(ssd ? TierKind::kSsd : TierKind::kHost, kBytes);
  store.write(extent, memory, kind).wait();
  for (auto _ : state) {
    if (write) {
      store.write(extent, memory, kind).wait();
    } else {
      store.read(extent, memory, kind).wait();
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBytes));
  store.release(extent);
  copier->free_device(memory);
}
BENCHMARK(BM_TierStore)
    ->ArgNames({"ssd", "uring", "device", "write"})
    ->Args({0, 0, 1, 1})
    ->Args({0, 0, 1, 0})
    ->Args({1, 0, 0, 1})
    ->Args({1, 0, 0, 0})
    ->Args({1, 0, 1, 1})
    ->Args({1, 0, 1, 0})
    ->Args({1, 1, 0, 1})
    ->Args({1, 1, 0, 0})
    ->Args({1, 1, 1, 1})
    ->Args({1, 1, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The pauses of the polling threads as they sleep them: 5 us (the copier's dispatchers,
// io/copy_lane_cuda) and 20 us (the tier store's watchers), with the slack the thread has (the
// kernel's default: 50 us) and with kPollingTimerSlack. Real time per iteration is the pause.
void BM_PollingPause(benchmark::State& state) {
  const auto pause = std::chrono::microseconds(state.range(0));
  const bool fine = state.range(1) == 1;
  const auto before = timer_slack();
  if (fine && !set_timer_slack(kPollingTimerSlack)) state.SkipWithError("cannot set the timer slack");
  for (auto _ : state) std::this_thread::sleep_for(pause);
  if (before) set_timer_slack(*before);
  state.SetLabel(fine ? "1 us slack" : "the thread's slack");
}
BENCHMARK(BM_PollingPause)
    ->ArgNames({"pause_us", "fine"})
    ->Args({5, 0})
    ->Args({5, 1})
    ->Args({20, 0})
    ->Args({20, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace teraio::io
