// The CUDA DeviceCopier: round trips of odd sizes in both directions, many copies in flight,
// errors as Error{kCuda}. Runs on the GPU machine; skips where no CUDA device is visible
// (except the checks that a missing device is reported cleanly).
#include <gtest/gtest.h>

#ifdef TERAIO_TEST_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/timer_slack.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/device_copy.hpp"

namespace teraio::io {
namespace {

bool have_device() {
  return cuda_compiled_in() && !cuda_inventory().devices.empty();
}

TEST(CudaCopier, InventoryAlwaysExplainsItself) {
  const CudaInventory inventory = cuda_inventory();
  EXPECT_FALSE(inventory.detail.empty());
  for (const auto& line : inventory.devices) std::printf("CUDA device %s\n", line.c_str());
  std::printf("CUDA: %s\n", inventory.detail.c_str());
}

TEST(CudaCopier, MissingDeviceIsACleanError) {
  if (!cuda_compiled_in()) {
    EXPECT_THROW(make_cuda_copier(0), Error);
    return;
  }
  const int count = static_cast<int>(cuda_inventory().devices.size());
  try {
    make_cuda_copier(count);  // one past the last device
    FAIL() << "device " << count << " cannot exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCuda) << e.what();
  }
}

// Page-aligned host memory, page-locked through the copier for the test's lifetime.
class PinnedBuffer {
 public:
  PinnedBuffer(DeviceCopier& copier, std::size_t n)
      : copier_(copier),
        data_(static_cast<std::uint8_t*>(std::aligned_alloc(kPageSize, align_up(n, kPageSize)))) {
    copier_.pin(data_, align_up(n, kPageSize));
  }
  ~PinnedBuffer() {
    copier_.unpin(data_);
    std::free(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  std::uint8_t* data() { return data_; }

 private:
  DeviceCopier& copier_;
  std::uint8_t* data_;
};

class DeviceBuffer {
 public:
  DeviceBuffer(DeviceCopier& copier, std::size_t n) : copier_(copier), data_(copier.allocate_device(n)) {}
  ~DeviceBuffer() { copier_.free_device(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() { return data_; }

 private:
  DeviceCopier& copier_;
  void* data_;
};

TEST(CudaCopier, RoundTripsOddSizesExactly) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  auto copier = make_cuda_copier(0);
  EXPECT_TRUE(copier->is_cuda());
  EXPECT_EQ(copier->name(), "cuda:0");
  for (std::size_t n : {std::size_t{1}, std::size_t{199}, std::size_t{4095}, std::size_t{4097},
                        std::size_t{3 * kMiB + 5}, std::size_t{64 * kMiB}}) {
    PinnedBuffer source(*copier, n);
    PinnedBuffer back(*copier, n);
    DeviceBuffer device(*copier, n);
    for (std::size_t i = 0; i < n; ++i) source.data()[i] = static_cast<std::uint8_t>(i * 131 + n);
    std::memset(back.data(), 0, n);
    copier->to_device(device.data(), source.data(), n)->wait();
    auto event = copier->to_host(back.data(), device.data(), n);
    event->wait();
    EXPECT_TRUE(event->ready());
    EXPECT_EQ(std::memcmp(source.data(), back.data(), n), 0) << n << " bytes";
  }
}

TEST(CudaCopier, ManyCopiesInFlightInBothDirections) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  auto copier = make_cuda_copier(0);
  constexpr std::size_t kChunk = 1 * kMiB;
  constexpr int kChunks = 64;
  PinnedBuffer up(*copier, kChunk * kChunks);
  PinnedBuffer down(*copier, kChunk * kChunks);
  DeviceBuffer a(*copier, kChunk * kChunks);
  DeviceBuffer b(*copier, kChunk * kChunks);
  for (std::size_t i = 0; i < kChunk * kChunks; ++i) up.data()[i] = static_cast<std::uint8_t>(i ^ (i >> 9));
  // b holds known bytes first, so the later to_host of b can run beside the to_device of a.
  copier->to_device(b.data(), up.data(), kChunk * kChunks)->wait();
  std::vector<std::unique_ptr<CopyEvent>> events;
  for (int c = 0; c < kChunks; ++c) {
    const std::size_t off = static_cast<std::size_t>(c) * kChunk;
    events.push_back(copier->to_device(static_cast<std::uint8_t*>(a.data()) + off, up.data() + off, kChunk));
    events.push_back(copier->to_host(down.data() + off, static_cast<std::uint8_t*>(b.data()) + off, kChunk));
  }
  for (auto& e : events) e->wait();
  for (auto& e : events) EXPECT_TRUE(e->ready());
  EXPECT_EQ(std::memcmp(up.data(), down.data(), kChunk * kChunks), 0);
  events.clear();
  copier->to_host(down.data(), a.data(), kChunk * kChunks)->wait();
  EXPECT_EQ(std::memcmp(up.data(), down.data(), kChunk * kChunks), 0);
}

// Deadline order: a copy for a near deadline issued after one for a far deadline overtakes it.
// In issue order the stream runs them as issued. Timing-based, with wide margins: the large
// copy takes ~10 ms at PCIe speed, the small one well under one.
TEST(CudaCopier, DeadlineOrderLetsANearDeadlineOvertakeAFarOne) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t kLarge = 512 * kMiB;
  constexpr std::size_t kSmall = 4 * kMiB;
  for (const CopyOrder order : {CopyOrder::kDeadline, CopyOrder::kIssue}) {
    auto copier = make_cuda_copier(0, order);
    std::printf("copier %s in %s\n", copier->name().c_str(), copier->order().c_str());
    ASSERT_EQ(copier->order().rfind(order == CopyOrder::kDeadline ? "deadline order" : "issue order", 0), 0u)
        << copier->order();
    EXPECT_EQ(copier->completes_in_order(), order == CopyOrder::kIssue);
    PinnedBuffer host(*copier, kLarge);
    DeviceBuffer large(*copier, kLarge);
    DeviceBuffer small(*copier, kSmall);
    auto far = copier->to_device(large.data(), host.data(), kLarge, {false, 1000});
    auto near = copier->to_device(small.data(), host.data(), kSmall, {false, 1});
    near->wait();
    const bool far_done = far->ready();
    far->wait();
    EXPECT_EQ(far_done, order == CopyOrder::kIssue) << to_string(order) << " order";
  }
}

// The dispatcher's account of each direction: every byte it put on the stream, and its time
// split into busy, waiting and idle, adding up to the time between two takes. A 512 MiB copy
// at PCIe speed keeps the lane busy for about 10 ms; nothing happens to the other direction.
// Each lane's dispatcher polls every few microseconds only with a small timer slack: with the
// kernel's default (50 us) each look would come ~60 us late. The copier's order line says the
// slack the dispatchers read back (core/timer_slack).
TEST(CudaCopier, DeadlineLanesSayTheTimerSlackTheyPollWith) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  auto copier = make_cuda_copier(0, CopyOrder::kDeadline);
  std::string order = copier->order();
  for (int attempt = 0; attempt < 200 && order.find("not yet known") != std::string::npos; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    order = copier->order();
  }
  const auto slack = polling_timer_slack();
  if (!slack) GTEST_SKIP() << "TERAIO_POLL_SLACK=kernel leaves the slack alone";
  EXPECT_NE(order.find(cat("dispatchers poll with ",
                           format_duration(std::chrono::duration<double>(*slack).count()), " timer slack)")),
            std::string::npos)
      << order;
}

TEST(CudaCopier, LinkActivityAccountsForEveryByteAndTheWholeTime) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t n = 512 * kMiB;
  EXPECT_FALSE(make_cuda_copier(0, CopyOrder::kIssue)->take_link_activity().has_value());
  auto copier = make_cuda_copier(0, CopyOrder::kDeadline);
  PinnedBuffer host(*copier, n);
  DeviceBuffer device(*copier, n);
  static_cast<void>(copier->take_link_activity());
  const auto start = std::chrono::steady_clock::now();
  copier->to_device(device.data(), host.data(), n)->wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::optional<LinkActivities> link = copier->take_link_activity();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(link.has_value());
  const LinkActivity& in = link->to_device;
  std::printf("to device: busy %.4f s, waiting %.4f s, idle %.4f s, %llu chunks, wall %.4f s\n", in.busy_s,
              in.waiting_s, in.idle_s, static_cast<unsigned long long>(in.chunks), wall);
  EXPECT_EQ(in.bytes, n);
  EXPECT_EQ(in.chunks, n / (8 * kMiB));
  EXPECT_GT(in.busy_s, 0.001);                                     // 512 MiB cannot cross in 1 ms
  EXPECT_GT(in.idle_s, 0.015);                                     // the 20 ms sleep
  EXPECT_NEAR(in.busy_s + in.waiting_s + in.idle_s, wall, 0.005);  // nothing unaccounted
  EXPECT_EQ(in.gated_flushes, 0u);                                 // nothing waited for a compute marker
  EXPECT_EQ(link->to_host.bytes, 0u);
  EXPECT_EQ(link->to_host.busy_s, 0.0);
  EXPECT_EQ(copier->take_link_activity()->to_device.bytes, 0u);  // counting starts again
}

// A copy waited for before the compute stream reaches its marker goes onto the side stream
// behind a device-side wait for the marker, and the link activity counts it: the compute
// stream (the legacy default one here) is held by a 1 GiB copy (about 20 ms), the marker comes
// after that, and the small copy is waited for at once.
// A 1 GiB copy to the device that the legacy default stream waits for (~20 ms), a compute
// marker behind that wait, and an 8 MiB copy issued after the marker: waited for before the GPU
// has passed its marker. Buffers for a copy out are made before the hold starts, so that making
// them does not eat into it.
struct BehindAHeldMarker {
  static constexpr std::size_t kBig = 1024 * kMiB;
  static constexpr std::size_t kSmall = 8 * kMiB;
  explicit BehindAHeldMarker(CopyOrder order)
      : copier(make_cuda_copier(0, order)),
        host(*copier, kBig),
        big(*copier, kBig),
        small(*copier, kSmall),
        out_source(*copier, kSmall),
        out_back(*copier, kSmall) {
    static_cast<void>(copier->take_link_activity());
    holding = copier->to_device(big.data(), host.data(), kBig, {false, 1000});
    holding->block_stream(nullptr);                              // the compute stream waits ~20 ms
    copier->wait_for_stream(nullptr, CopyDirection::kToDevice);  // the marker: after that wait
    waited = copier->to_device(small.data(), host.data(), kSmall, {false, 1});
  }
  std::unique_ptr<DeviceCopier> copier;
  PinnedBuffer host;
  DeviceBuffer big;
  DeviceBuffer small;
  DeviceBuffer out_source;
  PinnedBuffer out_back;
  std::unique_ptr<CopyEvent> holding;
  std::unique_ptr<CopyEvent> waited;
};

TEST(CudaCopier, AFlushBeforeItsMarkerPassedIsCountedAsGated) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  BehindAHeldMarker t(CopyOrder::kDeadline);
  EXPECT_EQ(t.waited->block_stream(nullptr), StreamWait::kGated);
  t.waited->wait();
  t.holding->wait();
  EXPECT_EQ(t.waited->block_stream(nullptr), StreamWait::kDone);  // a completed copy: nothing to wait for
  const LinkActivity in = t.copier->take_link_activity()->to_device;
  EXPECT_EQ(in.gated_flushes, 1u);
  EXPECT_EQ(in.gated_bytes, BehindAHeldMarker::kSmall);
  EXPECT_EQ(in.bytes, BehindAHeldMarker::kBig + BehindAHeldMarker::kSmall);
  EXPECT_EQ(in.host_waited_s, 0.0);
}

// In deadline-host-waits order the same copy is not gated: the thread waits until the GPU has
// passed the marker (behind the ~20 ms hold), then the copy goes on the lane's stream.
TEST(CudaCopier, InHostWaitsOrderTheHostWaitsForTheMarkerInsteadOfGating) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  BehindAHeldMarker t(CopyOrder::kDeadlineHostWaits);
  const StreamWait how = t.waited->block_stream(nullptr);
  // Once the marker passed, the dispatcher may have queued it already, or even finished it.
  EXPECT_NE(how, StreamWait::kGated) << to_string(how);
  t.waited->wait();
  t.holding->wait();
  const LinkActivity in = t.copier->take_link_activity()->to_device;
  std::printf("host waited %.1f ms for the marker; the copy stood %s\n", in.host_waited_s * 1e3,
              std::string(to_string(how)).c_str());
  EXPECT_EQ(in.gated_flushes, 0u);
  EXPECT_GT(in.host_waited_s, 0.005);  // the hold: 1 GiB at ~50 GB/s, ~20 ms
  EXPECT_EQ(in.bytes, BehindAHeldMarker::kBig + BehindAHeldMarker::kSmall);
}

// Without a plan (DeviceCopier::serve_plan(false)) the host-waits orders gate such a copy as
// deadline order does, and the host does not wait; serving a plan again, it waits again.
TEST(CudaCopier, WithoutAPlanTheHostWaitsOrdersGate) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  for (const CopyOrder order : {CopyOrder::kDeadlineHostWaits, CopyOrder::kDeadlineHostWaitsIn}) {
    for (const bool again : {false, true}) {
      BehindAHeldMarker t(order);
      t.copier->serve_plan(false);
      if (again) t.copier->serve_plan(true);
      const StreamWait how = t.waited->block_stream(nullptr);
      t.waited->wait();
      t.holding->wait();
      const LinkActivity in = t.copier->take_link_activity()->to_device;
      if (again) {
        EXPECT_NE(how, StreamWait::kGated) << to_string(order);
        EXPECT_EQ(in.gated_flushes, 0u) << to_string(order);
        EXPECT_GT(in.host_waited_s, 0.005) << to_string(order);  // the ~20 ms hold
      } else {
        EXPECT_EQ(how, StreamWait::kGated) << to_string(order);
        EXPECT_EQ(in.gated_flushes, 1u) << to_string(order);
        EXPECT_EQ(in.host_waited_s, 0.0) << to_string(order);
      }
    }
  }
}

// In deadline-host-waits-in order only copies into the device wait on the host: a copy out
// waited for behind the same hold is gated as in deadline order.
TEST(CudaCopier, InHostWaitsInOrderOnlyCopiesInWaitOnTheHost) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  BehindAHeldMarker t(CopyOrder::kDeadlineHostWaitsIn);
  t.copier->wait_for_stream(nullptr, CopyDirection::kToHost);  // a marker after the hold
  auto out = t.copier->to_host(t.out_back.data(), t.out_source.data(), BehindAHeldMarker::kSmall, {false, 1});
  EXPECT_EQ(out->block_stream(nullptr), StreamWait::kGated);
  EXPECT_NE(t.waited->block_stream(nullptr), StreamWait::kGated);
  out->wait();
  t.waited->wait();
  t.holding->wait();
  const LinkActivities link = *t.copier->take_link_activity();
  std::printf("host waited %.1f ms for the marker of the copy in, %.1f ms for the copy out's\n",
              link.to_device.host_waited_s * 1e3, link.to_host.host_waited_s * 1e3);
  EXPECT_EQ(link.to_host.gated_flushes, 1u);
  EXPECT_EQ(link.to_host.host_waited_s, 0.0);
  EXPECT_EQ(link.to_device.gated_flushes, 0u);
  EXPECT_GT(link.to_device.host_waited_s, 0.005);  // the hold: 1 GiB at ~50 GB/s, ~20 ms
  EXPECT_NE(t.copier->order().find("the host waiting for the markers of copies in"), std::string::npos)
      << t.copier->order();
}

// Ends the test process when a step takes longer than `limit`: a hang behind a stream's wait on
// a flag that is never set would otherwise hang the whole test binary.
class Watchdog {
 public:
  Watchdog(const char* what, std::chrono::seconds limit)
      : thread_([this, what, limit] {
          std::unique_lock lock(mutex_);
          if (!done_changed_.wait_for(lock, limit, [&] { return done_; })) {
            std::fprintf(stderr, "%s did not finish within %lld s: the GPU waits on a flag never set\n", what,
                         static_cast<long long>(limit.count()));
            std::_Exit(1);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_changed_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::thread thread_;
};

// In deadline-device-waits-in order a copy into the device waited for before the GPU passed its
// marker (behind the ~20 ms hold) is awaited: the host goes on at once, and the compute stream
// waits on a flag that the lane sets behind the copy it queues once the marker passes. Work
// queued behind the wait (a copy out of the awaited copy's last 8 MiB, behind a marker after
// the wait) sees the copied bytes: without the wait that copy out would start as the hold ends,
// with the 256 MiB copy in (~5 ms) just starting, and read its tail before it landed.
struct AwaitedBehindAHeldMarker {
  static constexpr std::size_t kBig = 1024 * kMiB;
  static constexpr std::size_t kAwaited = 256 * kMiB;
  static constexpr std::size_t kTail = 8 * kMiB;
  AwaitedBehindAHeldMarker()
      : copier(make_cuda_copier(0, CopyOrder::kDeadlineDeviceWaitsIn)),
        host(*copier, kBig),
        back(*copier, kTail),
        big(*copier, kBig),
        awaited(*copier, kAwaited) {
    for (std::size_t i = 0; i < kAwaited; ++i) host.data()[i] = static_cast<std::uint8_t>(i * 7 + 3);
    std::memset(back.data(), 0, kTail);
    // The tail zeroed first: the last test's buffer of the same size may hold the pattern.
    copier->to_device(static_cast<std::uint8_t*>(awaited.data()) + kAwaited - kTail, back.data(), kTail)
        ->wait();
    static_cast<void>(copier->take_link_activity());
    holding = copier->to_device(big.data(), host.data(), kBig, {false, 1000});
    holding->block_stream(nullptr);                              // the compute stream waits ~20 ms
    copier->wait_for_stream(nullptr, CopyDirection::kToDevice);  // the marker: after that wait
    waited = copier->to_device(awaited.data(), host.data(), kAwaited, {false, 1});
  }
  // Whether the awaited copy's tail was there for the work queued behind the compute stream's wait.
  bool seen_after_the_wait() {
    copier->wait_for_stream(nullptr, CopyDirection::kToHost);
    constexpr std::size_t kTailAt = kAwaited - kTail;
    copier->to_host(back.data(), static_cast<std::uint8_t*>(awaited.data()) + kTailAt, kTail)->wait();
    return std::memcmp(back.data(), host.data() + kTailAt, kTail) == 0;
  }
  std::unique_ptr<DeviceCopier> copier;
  PinnedBuffer host;
  PinnedBuffer back;
  DeviceBuffer big;
  DeviceBuffer awaited;
  std::unique_ptr<CopyEvent> holding;
  std::unique_ptr<CopyEvent> waited;
};

TEST(CudaCopier, InDeviceWaitsInOrderTheGpuWaitsOnAFlagAndTheHostGoesOn) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  const Watchdog watchdog("the awaited copy", std::chrono::seconds(30));
  AwaitedBehindAHeldMarker t;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(t.waited->block_stream(nullptr), StreamWait::kAwaited);
  const double blocked_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(t.waited->block_stream(nullptr), StreamWait::kAwaited);  // a second wait, on the same flag
  EXPECT_TRUE(t.seen_after_the_wait());
  t.waited->wait();
  t.holding->wait();
  const LinkActivity in = t.copier->take_link_activity()->to_device;
  std::printf("block_stream returned after %.3f ms; the lane to the device busy %.1f ms\n", blocked_s * 1e3,
              in.busy_s * 1e3);
  EXPECT_LT(blocked_s, 0.005);  // the hold: 1 GiB at ~50 GB/s, ~20 ms, which a host wait would take
  EXPECT_EQ(in.awaited, 1u);
  EXPECT_EQ(in.awaited_bytes, AwaitedBehindAHeldMarker::kAwaited);
  EXPECT_EQ(in.gated_flushes, 0u);
  EXPECT_EQ(in.host_waited_s, 0.0);
  EXPECT_EQ(in.bytes, AwaitedBehindAHeldMarker::kBig + AwaitedBehindAHeldMarker::kAwaited);
  EXPECT_NE(t.copier->order().find("the GPU waiting on flags for copies in"), std::string::npos)
      << t.copier->order();
}

// cudaFree waits for the device, the compute stream included, which waits for the dispatcher's
// calls: they must get through while cudaFree waits.
TEST(CudaCopier, ADeviceWaitForACopyNotYetQueuedLetsADeviceSynchronizationEnd) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  const Watchdog watchdog("cudaFree behind an awaited copy", std::chrono::seconds(30));
  AwaitedBehindAHeldMarker t;
  auto freed = std::make_unique<DeviceBuffer>(*t.copier, kMiB);
  ASSERT_EQ(t.waited->block_stream(nullptr), StreamWait::kAwaited);
  const auto start = std::chrono::steady_clock::now();
  freed.reset();
  const double free_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("cudaFree returned after %.1f ms\n", free_s * 1e3);
  EXPECT_GT(free_s, 0.005);  // it waited for the hold and the awaited copy (~25 ms)
  t.waited->wait();
  EXPECT_TRUE(t.seen_after_the_wait());
  t.holding->wait();
}

#ifdef TERAIO_TEST_CUDA_RUNTIME
// CUDA does not see what a wait on a flag waits for: a compute stream sharing a hardware queue
// with the lane's stream could hold the copy and the flag's setting behind its wait. 32 compute
// streams made after the copier (the default is 8 queues) each wait for a copy of their own
// behind one ~20 ms hold, and copy it on, device to device, right behind the wait: every stream
// must pass, each seeing its bytes.
TEST(CudaCopier, AwaitedCopiesPassOnManyComputeStreams) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  const Watchdog watchdog("32 compute streams behind awaited copies", std::chrono::seconds(60));
  constexpr int kStreams = 32;
  constexpr std::size_t kHold = 1024 * kMiB;
  constexpr std::size_t kEach = 8 * kMiB;
  auto copier = make_cuda_copier(0, CopyOrder::kDeadlineDeviceWaitsIn);
  PinnedBuffer host(*copier, kHold);
  PinnedBuffer back(*copier, kEach * kStreams);
  DeviceBuffer hold(*copier, kHold);
  DeviceBuffer landed(*copier, kEach * kStreams);
  DeviceBuffer seen(*copier, kEach * kStreams);
  for (std::size_t i = 0; i < kEach * kStreams; ++i) host.data()[i] = static_cast<std::uint8_t>(i * 11 + 5);
  ASSERT_EQ(cudaMemset(landed.data(), 0, kEach * kStreams), cudaSuccess);
  ASSERT_EQ(cudaMemset(seen.data(), 0, kEach * kStreams), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<cudaStream_t> streams(kStreams);
  for (cudaStream_t& stream : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto holding = copier->to_device(hold.data(), host.data(), kHold, {false, 1000});
  std::vector<std::unique_ptr<CopyEvent>> copies;
  for (int s = 0; s < kStreams; ++s) {
    const std::size_t at = static_cast<std::size_t>(s) * kEach;
    holding->block_stream(streams[s]);                              // each stream behind the hold
    copier->wait_for_stream(streams[s], CopyDirection::kToDevice);  // its marker: after that
    copies.push_back(copier->to_device(static_cast<std::uint8_t*>(landed.data()) + at, host.data() + at,
                                       kEach, {false, static_cast<std::uint64_t>(s + 1)}));
    EXPECT_EQ(copies.back()->block_stream(streams[s]), StreamWait::kAwaited) << "stream " << s;
    ASSERT_EQ(cudaMemcpyAsync(static_cast<std::uint8_t*>(seen.data()) + at,
                              static_cast<std::uint8_t*>(landed.data()) + at, kEach, cudaMemcpyDeviceToDevice,
                              streams[s]),
              cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), seen.data(), kEach * kStreams, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int s = 0; s < kStreams; ++s) {
    const std::size_t at = static_cast<std::size_t>(s) * kEach;
    EXPECT_EQ(std::memcmp(back.data() + at, host.data() + at, kEach), 0) << "stream " << s;
  }
  for (auto& copy : copies) copy->wait();
  holding->wait();
  EXPECT_EQ(copier->take_link_activity()->to_device.awaited, static_cast<std::uint64_t>(kStreams));
  for (cudaStream_t stream : streams) EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}
#endif

// Without a plan the device-waits order gates such a copy as deadline order does.
TEST(CudaCopier, WithoutAPlanTheDeviceWaitsOrderGates) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  const Watchdog watchdog("the gated copy", std::chrono::seconds(30));
  AwaitedBehindAHeldMarker t;
  t.copier->serve_plan(false);
  EXPECT_EQ(t.waited->block_stream(nullptr), StreamWait::kGated);
  t.copier->serve_plan(true);
  // Its rest is on the side stream now: a later wait, its marker still ahead, takes the event.
  EXPECT_NE(t.waited->block_stream(nullptr), StreamWait::kAwaited);
  EXPECT_TRUE(t.seen_after_the_wait());
  t.holding->wait();
  const LinkActivity in = t.copier->take_link_activity()->to_device;
  EXPECT_EQ(in.awaited, 0u);
  EXPECT_EQ(in.gated_flushes, 1u);
}

// A copy waited for before its marker passed waits for the marker on a side stream, not on the
// lane's stream: a ready copy behind it on the lane finishes long before the marker passes. The
// compute stream is held by a 2 GiB copy to the host (about 40 ms); 256 MiB to the device take
// about 5 ms. With the marker's wait on the lane's stream they would take the 40 ms.
TEST(CudaCopier, AGatedCopyDoesNotHoldUpTheReadyOnesBehindIt) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t kHold = 2048 * kMiB;
  constexpr std::size_t kReady = 256 * kMiB;
  constexpr std::size_t kGated = 8 * kMiB;
  auto copier = make_cuda_copier(0, CopyOrder::kDeadline);
  PinnedBuffer host(*copier, kHold);
  PinnedBuffer source(*copier, kReady);  // apart from what the hold writes
  DeviceBuffer device(*copier, kHold);
  DeviceBuffer ready_in(*copier, kReady);
  DeviceBuffer gated_in(*copier, kGated);
  auto holding = copier->to_host(host.data(), device.data(), kHold);
  holding->block_stream(nullptr);  // the compute stream waits ~40 ms
  auto ready = copier->to_device(ready_in.data(), source.data(), kReady, {false, 1000});  // no marker
  copier->wait_for_stream(nullptr, CopyDirection::kToDevice);  // passes after the 40 ms
  auto gated = copier->to_device(gated_in.data(), source.data(), kGated, {false, 1});
  const auto start = std::chrono::steady_clock::now();
  gated->block_stream(nullptr);
  ready->wait();
  const double ready_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool holding_done = holding->ready();
  gated->wait();
  holding->wait();
  std::printf("ready copy done %.1f ms after the gated flush; the hold %s\n", ready_s * 1e3,
              holding_done ? "had ended" : "had not ended");
  EXPECT_FALSE(holding_done);
  EXPECT_LT(ready_s, 0.025);
  EXPECT_EQ(copier->take_link_activity()->to_device.gated_flushes, 1u);
}

// In deadline-alone order a gated copy has the link to itself once its marker passes: the lane
// holds the chunks of a large ready copy back meanwhile (held_s); deadline order lets them go on
// beside it. The compute stream is held by a 2 GiB copy to the host (about 40 ms); a 4 GiB copy
// to the device (about 85 ms) runs on the lane all along; the 256 MiB gated copy moves once the
// hold ends (about 5 ms alone, twice that if the two streams split the link). The time from the
// hold's end to the gated copy's end is printed for both orders: the premise of the hold.
TEST(CudaCopier, AGatedCopyHasTheLinkToItselfInDeadlineAloneOrder) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t kHold = 2048 * kMiB;
  constexpr std::size_t kReady = 4096 * kMiB;
  constexpr std::size_t kGated = 256 * kMiB;
  for (const CopyOrder order :
       {CopyOrder::kDeadlineAlone, CopyOrder::kDeadline, CopyOrder::kDeadlineChunked}) {
    auto copier = make_cuda_copier(0, order);
    PinnedBuffer host(*copier, kHold);
    PinnedBuffer source(*copier, kReady);
    DeviceBuffer device(*copier, kHold);
    DeviceBuffer ready_in(*copier, kReady);
    DeviceBuffer gated_in(*copier, kGated);
    static_cast<void>(copier->take_link_activity());
    auto holding = copier->to_host(host.data(), device.data(), kHold);
    holding->block_stream(nullptr);
    auto ready = copier->to_device(ready_in.data(), source.data(), kReady, {false, 1000});
    copier->wait_for_stream(nullptr, CopyDirection::kToDevice);
    auto gated = copier->to_device(gated_in.data(), source.data(), kGated, {false, 1});
    EXPECT_EQ(gated->block_stream(nullptr), StreamWait::kGated) << to_string(order);
    holding->wait();
    const auto hold_end = std::chrono::steady_clock::now();
    const bool ready_done = ready->ready();
    gated->wait();
    const double gated_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - hold_end).count();
    ready->wait();
    const LinkActivity in = copier->take_link_activity()->to_device;
    std::printf(
        "%s order: gated copy done %.1f ms after the hold ended (ready copy %s then); lane held %.1f ms\n",
        std::string(to_string(order)).c_str(), gated_s * 1e3, ready_done ? "done" : "still running",
        in.held_s * 1e3);
    EXPECT_FALSE(ready_done) << to_string(order);  // otherwise the gated copy had the link anyway
    EXPECT_EQ(in.bytes, kReady + kGated);
    // The gated copy's rest: one piece, or 8 MiB chunks in deadline-chunked order.
    EXPECT_EQ(in.chunks,
              kReady / (8 * kMiB) + (order == CopyOrder::kDeadlineChunked ? kGated / (8 * kMiB) : 1))
        << to_string(order);
    if (order == CopyOrder::kDeadlineAlone) {
      EXPECT_GT(in.held_s, 0.002);  // 256 MiB need ~5 ms at 50 GB/s
    } else {
      EXPECT_EQ(in.held_s, 0.0);
    }
  }
}

// A stream may wait for a copy before the dispatcher has queued it anywhere (a slot in device
// memory, not an event); work queued behind that wait sees the copied bytes.
TEST(CudaCopier, AStreamWaitsForACopyNotYetQueued) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t n = 64 * kMiB;
  for (const CopyOrder order : {CopyOrder::kDeadline, CopyOrder::kIssue}) {
    auto copier = make_cuda_copier(0, order);
    PinnedBuffer source(*copier, n);
    PinnedBuffer back(*copier, n);
    DeviceBuffer device(*copier, n);
    for (std::size_t i = 0; i < n; ++i) source.data()[i] = static_cast<std::uint8_t>(i * 7 + 3);
    std::memset(back.data(), 0, n);
    // Behind a far-deadline copy of the same size, so the copy waited for is still scheduled.
    DeviceBuffer other(*copier, n);
    auto first = copier->to_device(other.data(), source.data(), n, {false, 1000});
    auto copy_in = copier->to_device(device.data(), source.data(), n, {false, 2000});
    copy_in->block_stream(nullptr);  // the legacy default stream waits for the copy in
    copier->wait_for_stream(nullptr, CopyDirection::kToHost);  // the copy out waits for that stream
    copier->to_host(back.data(), device.data(), n)->wait();
    EXPECT_EQ(std::memcmp(source.data(), back.data(), n), 0) << to_string(order) << " order";
    first->wait();
    copy_in->wait();
  }
}

// An offload taken back while it waits behind another copy: abandoned, it still completes,
// without copying the bytes it had not started (deadline order), or whole (issue order, where
// it was on the stream already); the stream that waits for it is not left waiting.
TEST(CudaCopier, AnAbandonedCopyCompletesWithoutItsUnstartedBytes) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t kLarge = 512 * kMiB;
  constexpr std::size_t n = 64 * kMiB;
  for (const CopyOrder order : {CopyOrder::kDeadline, CopyOrder::kIssue}) {
    auto copier = make_cuda_copier(0, order);
    PinnedBuffer staging(*copier, kLarge);
    PinnedBuffer source(*copier, n);
    PinnedBuffer out(*copier, n);
    DeviceBuffer large(*copier, kLarge);
    auto device = std::make_unique<DeviceBuffer>(*copier, n);
    for (std::size_t i = 0; i < n; ++i) source.data()[i] = static_cast<std::uint8_t>(i * 5 + 1);
    copier->to_device(device->data(), source.data(), n)->wait();
    std::memset(out.data(), 0, n);
    // Behind a copy out of an earlier deadline: the copy out abandoned has not started.
    auto first = copier->to_host(staging.data(), large.data(), kLarge, {false, 1000});
    auto copy_out = copier->to_host(out.data(), device->data(), n, {false, 2000});
    // The legacy default stream waits for what has started (in issue order, the whole copy).
    copy_out->abandon(nullptr);
    device.reset();  // the program frees the source: no later copy may read it
    copy_out->wait();
    first->wait();
    const bool copied = std::memcmp(source.data(), out.data(), n) == 0;
    EXPECT_EQ(copied, order == CopyOrder::kIssue) << to_string(order) << " order";
    EXPECT_EQ(copy_out->abandon(nullptr), 0u);  // complete: nothing to do
    // The copier goes on as before.
    DeviceBuffer again(*copier, n);
    copier->to_device(again.data(), source.data(), n)->wait();
    copier->to_host(out.data(), again.data(), n)->wait();
    EXPECT_EQ(std::memcmp(source.data(), out.data(), n), 0) << to_string(order) << " order";
  }
}

// The lanes' piece is a choice within bounds: under 1 MiB two queued pieces would not outlast
// the dispatcher's look every ~10 µs, over 256 MiB one would keep an urgent copy waiting ~5 ms.
TEST(CudaCopier, LaneChunksAreAChoiceWithinBounds) {
  EXPECT_EQ(checked_lane_chunk(kDefaultLaneChunkBytes), std::size_t{8} << 20);
  EXPECT_EQ(checked_lane_chunk(kMiB), kMiB);
  EXPECT_EQ(checked_lane_chunk(256 * kMiB), 256 * kMiB);
  EXPECT_EQ(checked_lane_chunk(2 * kMiB + 4096), 2 * kMiB + 4096);
  for (const std::size_t bad : {std::size_t{0}, std::size_t{512} << 10, 256 * kMiB + 4096, 2 * kMiB + 1})
    EXPECT_THROW(checked_lane_chunk(bad), Error) << bad;
  // Refused before any device is looked for, in builds with CUDA and without.
  try {
    make_cuda_copier(0, CopyOrder::kDeadline, 1000);
    ADD_FAILURE() << "a 1000-byte chunk was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
  }
}

// A lane with 2 MiB pieces moves a 64 MiB copy in 32 of them, exactly, and says so.
TEST(CudaCopier, ALaneMovesCopiesInTheChunksItWasGiven) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t n = 64 * kMiB;
  auto copier = make_cuda_copier(0, CopyOrder::kDeadline, 2 * kMiB);
  EXPECT_NE(copier->order().find("(2.0 MiB chunks;"), std::string::npos) << copier->order();
  PinnedBuffer source(*copier, n);
  PinnedBuffer out(*copier, n);
  DeviceBuffer device(*copier, n);
  for (std::size_t i = 0; i < n; ++i)
    static_cast<unsigned char*>(source.data())[i] = static_cast<unsigned char>(i * 7);
  static_cast<void>(copier->take_link_activity());
  copier->to_device(device.data(), source.data(), n)->wait();
  copier->to_host(out.data(), device.data(), n)->wait();
  const std::optional<LinkActivities> link = copier->take_link_activity();
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->to_device.chunks, n / (2 * kMiB));
  EXPECT_EQ(link->to_host.chunks, n / (2 * kMiB));
  EXPECT_EQ(std::memcmp(source.data(), out.data(), n), 0);
}

TEST(CudaCopier, AHoldQueuesNothingUntilItEndsAndIsQuietOnceTheLinkIs) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  EXPECT_EQ(make_cuda_copier(0, CopyOrder::kIssue)->hold_copies(HeldCopies::kBothWays), nullptr)
      << "issue order cannot hold";
  constexpr std::size_t n = 512 * kMiB;  // ~10 ms at 50 GB/s, 64 pieces of 8 MiB
  auto copier = make_cuda_copier(0, CopyOrder::kDeadline);
  PinnedBuffer source(*copier, n);
  DeviceBuffer device(*copier, n);
  static_cast<void>(copier->take_link_activity());
  const auto copy = copier->to_device(device.data(), source.data(), n);
  std::this_thread::sleep_for(std::chrono::milliseconds(1));  // some pieces on the link
  std::unique_ptr<CopyHold> hold = copier->hold_copies(HeldCopies::kBothWays);
  ASSERT_NE(hold, nullptr);
  EXPECT_TRUE(hold->quiet()) << "two 8 MiB pieces finish well within the hold's wait";
  // Held for 40 ms, four times what the whole copy needs: it must still be short of its end.
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  EXPECT_FALSE(copy->ready()) << "a piece was queued during the hold";
  hold.reset();
  copy->wait();
  const std::optional<LinkActivities> link = copier->take_link_activity();
  ASSERT_TRUE(link.has_value());
  std::printf("hold: %llu holds, %.1f ms held; the copy's pieces %llu\n",
              static_cast<unsigned long long>(link->to_device.holds), link->to_device.held_for_driver_s * 1e3,
              static_cast<unsigned long long>(link->to_device.chunks));
  EXPECT_EQ(link->to_device.holds, 1U);
  EXPECT_EQ(link->to_host.holds, 1U);
  EXPECT_GE(link->to_device.held_for_driver_s, 0.035);
  EXPECT_EQ(link->to_device.chunks, n / kDefaultLaneChunkBytes) << "the held pieces went after the hold";
}

TEST(CudaCopier, AHoldOfTheCopiesToTheHostLetsThoseIntoTheDeviceGoOn) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  constexpr std::size_t n = 512 * kMiB;  // ~10 ms a direction at 50 GB/s
  auto copier = make_cuda_copier(0, CopyOrder::kDeadline);
  PinnedBuffer host_in(*copier, n);
  PinnedBuffer host_out(*copier, n);
  DeviceBuffer device_in(*copier, n);
  DeviceBuffer device_out(*copier, n);
  static_cast<void>(copier->take_link_activity());
  const auto out = copier->to_host(host_out.data(), device_out.data(), n);
  const auto in = copier->to_device(device_in.data(), host_in.data(), n);
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::unique_ptr<CopyHold> hold = copier->hold_copies(HeldCopies::kToHost);
  ASSERT_NE(hold, nullptr);
  EXPECT_TRUE(hold->quiet()) << "the lane to the host has two 8 MiB pieces on the link at most";
  // 40 ms: four times what each copy needs alone.
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  EXPECT_TRUE(in->ready()) << "the copy into the device was held too";
  EXPECT_FALSE(out->ready()) << "a piece to the host was queued during the hold";
  hold.reset();
  out->wait();
  const std::optional<LinkActivities> link = copier->take_link_activity();
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->to_host.holds, 1U);
  EXPECT_EQ(link->to_device.holds, 0U);
  EXPECT_GE(link->to_host.held_for_driver_s, 0.035);
}

TEST(CudaCopier, CopiesToHoldParseAndPrint) {
  EXPECT_EQ(parse_held_copies("both"), HeldCopies::kBothWays);
  EXPECT_EQ(parse_held_copies("to-host"), HeldCopies::kToHost);
  EXPECT_EQ(to_string(HeldCopies::kBothWays), "both");
  EXPECT_EQ(to_string(HeldCopies::kToHost), "to-host");
  EXPECT_THROW(parse_held_copies("to-device"), Error);
}

TEST(CudaCopier, CopyOrdersParseAndPrint) {
  EXPECT_EQ(parse_copy_order("deadline"), CopyOrder::kDeadline);
  EXPECT_EQ(parse_copy_order("issue"), CopyOrder::kIssue);
  EXPECT_EQ(parse_copy_order("deadline-alone"), CopyOrder::kDeadlineAlone);
  EXPECT_EQ(parse_copy_order("deadline-chunked"), CopyOrder::kDeadlineChunked);
  EXPECT_EQ(to_string(CopyOrder::kDeadline), "deadline");
  EXPECT_EQ(to_string(CopyOrder::kDeadlineAlone), "deadline-alone");
  EXPECT_EQ(to_string(CopyOrder::kDeadlineChunked), "deadline-chunked");
  EXPECT_EQ(parse_copy_order("deadline-host-waits"), CopyOrder::kDeadlineHostWaits);
  EXPECT_EQ(to_string(CopyOrder::kDeadlineHostWaits), "deadline-host-waits");
  EXPECT_EQ(parse_copy_order("deadline-host-waits-in"), CopyOrder::kDeadlineHostWaitsIn);
  EXPECT_EQ(to_string(CopyOrder::kDeadlineHostWaitsIn), "deadline-host-waits-in");
  EXPECT_EQ(parse_copy_order("deadline-device-waits-in"), CopyOrder::kDeadlineDeviceWaitsIn);
  EXPECT_EQ(to_string(CopyOrder::kDeadlineDeviceWaitsIn), "deadline-device-waits-in");
  EXPECT_EQ(to_string(StreamWait::kAwaited), "awaited");
  EXPECT_THROW(parse_copy_order("fifo"), Error);
}

TEST(CudaCopier, FailuresAreCudaErrors) {
  if (!have_device()) GTEST_SKIP() << cuda_inventory().detail;
  auto copier = make_cuda_copier(0);
  PinnedBuffer host(*copier, kPageSize);
  // Registering the same memory twice is refused by the runtime.
  EXPECT_THROW(copier->pin(host.data(), kPageSize), Error);
  // An allocation no GPU can satisfy: refused synchronously, without poisoning the context.
  try {
    copier->allocate_device(std::size_t{1} << 50);
    FAIL() << "a 1 PiB device allocation cannot succeed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCuda) << e.what();
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
    std::printf("refused as expected: %s\n", e.what());
  }
  // The copier stays usable after a refused call.
  DeviceBuffer device(*copier, kPageSize);
  copier->to_device(device.data(), host.data(), kPageSize)->wait();
}

}  // namespace
}  // namespace teraio::io
