// Host-tier transfers of device memory that enqueue their copy on the submitting thread
// (EngineConfig::enqueue_host_copies): they carry the copy's event as their device side, are
// finished by the store's watcher threads, and keep the store's rules (failed writes are not
// read back, busy extents are not released, shutdown lets enqueued copies complete).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::io {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::TempDir;

constexpr std::size_t kBytes = 40 * kKiB + 123;

EngineConfig enqueuing_config() {
  EngineConfig config;
  config.host_capacity = 1 * kMiB;
  config.transfer_threads = 2;
  config.enqueue_host_copies = true;
  return config;
}

void wait_or_fail(const Transfer& transfer) {
  ASSERT_TRUE(transfer.wait_for(30s)) << "transfer hung";
  transfer.wait();
}

template <typename Call>
void expect_error(Call&& call, ErrorKind kind) {
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
  }
}

// "Device" memory of a copier, freed with it.
struct DeviceBuffer {
  DeviceBuffer(DeviceCopier& copier, std::size_t n) : copier_(copier), data(copier.allocate_device(n)) {}
  ~DeviceBuffer() { copier_.free_device(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<std::byte> bytes(std::size_t n) const {
    const auto* p = static_cast<const std::byte*>(data);
    return {p, p + n};
  }
  DeviceCopier& copier_;
  void* data;
};

// A copier whose copies, while held, run only when the test completes them (in order); until
// then their events are not ready and wait() blocks. One copy can be made to fail.
class GatedCopier final : public DeviceCopier {
 public:
  void hold(bool on) {
    std::lock_guard lock(mutex_);
    held_ = on;
  }
  void fail_next() {
    std::lock_guard lock(mutex_);
    fail_next_ = true;
  }
  void complete_all() {
    {
      std::lock_guard lock(mutex_);
      for (const auto& copy : queued_) run(*copy);
      queued_.clear();
    }
    completed_.notify_all();
  }

  std::string name() const override { return "gated"; }
  bool is_cuda() const override { return false; }
  std::unique_ptr<CopyEvent> to_host(void* host_dst, const void* device_src, std::size_t n,
                                     CopyPriority) override {
    return enqueue(host_dst, device_src, n);
  }
  std::unique_ptr<CopyEvent> to_device(void* device_dst, const void* host_src, std::size_t n,
                                       CopyPriority) override {
    return enqueue(device_dst, host_src, n);
  }
  void pin(void*, std::size_t) override {}
  void unpin(void*) override {}
  void* allocate_device(std::size_t n) override { return ::operator new(n == 0 ? 1 : n); }
  void free_device(void* device) override { ::operator delete(device); }

 private:
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t n = 0;
    bool fails = false;
    bool done = false;  // guarded by the copier's mutex
  };
  class Event final : public CopyEvent {
   public:
    Event(GatedCopier& copier, std::shared_ptr<Copy> copy) : copier_(copier), copy_(std::move(copy)) {}
    bool ready() override {
      std::lock_guard lock(copier_.mutex_);
      return copy_->done;
    }
    void wait() override {
      std::unique_lock lock(copier_.mutex_);
      copier_.completed_.wait(lock, [&] { return copy_->done; });
      if (copy_->fails) throw Error(ErrorKind::kCuda, "copy failed on the test device");
    }
    StreamWait block_stream(void*) override { return StreamWait::kDone; }

   private:
    GatedCopier& copier_;
    std::shared_ptr<Copy> copy_;
  };

  std::unique_ptr<CopyEvent> enqueue(void* dst, const void* src, std::size_t n) {
    auto copy = std::make_shared<Copy>(Copy{dst, src, n});
    {
      std::lock_guard lock(mutex_);
      copy->fails = std::exchange(fail_next_, false);
      if (held_ || !queued_.empty()) {
        queued_.push_back(copy);
      } else {
        run(*copy);
      }
    }
    completed_.notify_all();
    return std::make_unique<Event>(*this, std::move(copy));
  }
  static void run(Copy& copy) {
    if (!copy.fails) std::memcpy(copy.dst, copy.src, copy.n);
    copy.done = true;
  }

  std::mutex mutex_;
  std::condition_variable completed_;
  std::deque<std::shared_ptr<Copy>> queued_;
  bool held_ = false;
  bool fail_next_ = false;
};

TEST(TierStoreEnqueue, HostTierDeviceTransfersCarryTheirCopyAndRoundTripExactly) {
  auto copier = make_host_copier();
  TierStore store(*copier, enqueuing_config());
  const auto data = pattern(kBytes, 1);
  DeviceBuffer src(*copier, kBytes), dst(*copier, kBytes);
  std::memcpy(src.data, data.data(), kBytes);
  const Extent extent = *store.allocate(TierKind::kHost, kBytes);
  const Transfer write = store.write(extent, src.data, MemoryKind::kDevice, "weights");
  ASSERT_NE(write.device_side(), nullptr);
  wait_or_fail(write);
  EXPECT_TRUE(write.device_side()->ready());
  const Transfer read = store.read(extent, dst.data, MemoryKind::kDevice);
  ASSERT_NE(read.device_side(), nullptr);
  wait_or_fail(read);
  EXPECT_EQ(dst.bytes(kBytes), data);
  const TierStoreReport report = store.report();
  EXPECT_EQ(report.host_bytes_written, kBytes);
  EXPECT_EQ(report.host_bytes_read, kBytes);
  store.release(extent);
  EXPECT_EQ(store.report().host_used, 0u);
}

TEST(TierStoreEnqueue, HostMemoryHasNoDeviceSide) {
  auto copier = make_host_copier();
  TierStore store(*copier, enqueuing_config());
  const auto data = pattern(kBytes, 2);
  std::vector<std::byte> back(kBytes);
  const Extent extent = *store.allocate(TierKind::kHost, kBytes);
  const Transfer write = store.write(extent, data.data(), MemoryKind::kHost);
  EXPECT_EQ(write.device_side(), nullptr);
  wait_or_fail(write);
  const Transfer read = store.read(extent, back.data(), MemoryKind::kHost);
  EXPECT_EQ(read.device_side(), nullptr);
  wait_or_fail(read);
  EXPECT_EQ(back, data);
  EXPECT_EQ(Transfer{}.device_side(), nullptr);
}

TEST(TierStoreEnqueue, SsdTierHasNoDeviceSide) {
  TempDir dir;
  auto copier = make_host_copier();
  EngineConfig config = enqueuing_config();
  config.ssd_paths = {dir.path()};
  config.ssd_capacity_per_path = 1 * kMiB;
  config.stripe_unit = 64 * kKiB;
  config.chunk_bytes = 16 * kKiB;
  config.bounce_pool_bytes = 64 * kKiB;
  config.backend = BackendChoice::kPosix;
  config.io_threads = 2;
  TierStore store(*copier, config);
  const auto data = pattern(kBytes, 3);
  DeviceBuffer src(*copier, kBytes), dst(*copier, kBytes);
  std::memcpy(src.data, data.data(), kBytes);
  const Extent extent = *store.allocate(TierKind::kSsd, kBytes);
  const Transfer write = store.write(extent, src.data, MemoryKind::kDevice);
  EXPECT_EQ(write.device_side(), nullptr);
  wait_or_fail(write);
  const Transfer read = store.read(extent, dst.data, MemoryKind::kDevice);
  EXPECT_EQ(read.device_side(), nullptr);
  wait_or_fail(read);
  EXPECT_EQ(dst.bytes(kBytes), data);
}

TEST(TierStoreEnqueue, ChecksumsKeepTheCopyOnTheHost) {
  auto copier = make_host_copier();
  EngineConfig config = enqueuing_config();
  config.checksums = true;
  TierStore store(*copier, config);
  const auto data = pattern(kBytes, 4);
  DeviceBuffer src(*copier, kBytes), dst(*copier, kBytes);
  std::memcpy(src.data, data.data(), kBytes);
  const Extent extent = *store.allocate(TierKind::kHost, kBytes);
  const Transfer write = store.write(extent, src.data, MemoryKind::kDevice);
  EXPECT_EQ(write.device_side(), nullptr);
  wait_or_fail(write);
  const Transfer read = store.read(extent, dst.data, MemoryKind::kDevice);
  EXPECT_EQ(read.device_side(), nullptr);
  wait_or_fail(read);
  EXPECT_EQ(dst.bytes(kBytes), data);
}

TEST(TierStoreEnqueue, HostCopierDoesNotEnqueueUnlessAskedTo) {
  auto copier = make_host_copier();
  EngineConfig config = enqueuing_config();
  config.enqueue_host_copies.reset();
  TierStore store(*copier, config);
  DeviceBuffer src(*copier, kBytes);
  const Extent extent = *store.allocate(TierKind::kHost, kBytes);
  const Transfer write = store.write(extent, src.data, MemoryKind::kDevice);
  EXPECT_EQ(write.device_side(), nullptr);
  wait_or_fail(write);
}

TEST(TierStoreEnqueue, TransferIsDoneOnlyOnceItsCopyHasRun) {
  GatedCopier copier;
  TierStore store(copier, enqueuing_config());
  const auto data = pattern(kBytes, 5);
  DeviceBuffer src(copier, kBytes), dst(copier, kBytes);
  std::memcpy(src.data, data.data(), kBytes);
  const Extent extent = *store.allocate(TierKind::kHost, kBytes);
  copier.hold(true);
  const Transfer write = store.write(extent, src.data, MemoryKind::kDevice);
  const Transfer read = store.read(extent, dst.data, MemoryKind::kDevice);
  ASSERT_NE(write.device_side(), nullptr);
  EXPECT_FALSE(write.device_side()->ready());
  EXPECT_FALSE(write.wait_for(50ms));
  EXPECT_FALSE(read.ready());
  copier.complete_all();
  wait_or_fail(write);
  wait_or_fail(read);
  EXPECT_EQ(dst.bytes(kBytes), data);
}

TEST(TierStoreEnqueue, ReadOfAFailedEnqueuedWriteIsRefused) {
  GatedCopier copier;
  TierStore store(copier, enqueuing_config());
  const auto data = pattern(kBytes, 6);
  DeviceBuffer src(copier, kBytes), dst(copier, kBytes);
  std::memcpy(src.data, data.data(), kBytes);
  const Extent extent = *store.allocate(TierKind::kHost, kBytes);
  copier.fail_next();
  const Transfer failed = store.write(extent, src.data, MemoryKind::kDevice, "tensor 6");
  ASSERT_TRUE(failed.wait_for(30s));
  expect_error([&] { failed.wait(); }, ErrorKind::kCuda);
  const Transfer refused = store.read(extent, dst.data, MemoryKind::kDevice);
  ASSERT_TRUE(refused.wait_for(30s));
  expect_error([&] { refused.wait(); }, ErrorKind::kIo);
  // A good write makes the extent readable again.
  wait_or_fail(store.write(extent, src.data, MemoryKind::kDevice));
  wait_or_fail(store.read(extent, dst.data, MemoryKind::kDevice));
  EXPECT_EQ(dst.bytes(kBytes), data);
  store.release(extent);
}

TEST(TierStoreEnqueue, ShutdownWaitsForEnqueuedCopies) {
  GatedCopier copier;
  TierStore store(copier, enqueuing_config());
  const auto data = pattern(kBytes, 7);
  DeviceBuffer src(copier, kBytes), dst(copier, kBytes);
  std::memcpy(src.data, data.data(), kBytes);
  const Extent written = *store.allocate(TierKind::kHost, kBytes);
  const Extent read_back = *store.allocate(TierKind::kHost, kBytes);
  wait_or_fail(store.write(read_back, src.data, MemoryKind::kDevice));
  copier.hold(true);
  const Transfer write = store.write(written, src.data, MemoryKind::kDevice);
  const Transfer read = store.read(read_back, dst.data, MemoryKind::kDevice);
  std::future<void> shutdown = std::async(std::launch::async, [&] { store.shutdown(); });
  EXPECT_EQ(shutdown.wait_for(100ms), std::future_status::timeout) << "shutdown did not wait for the copies";
  copier.complete_all();
  ASSERT_EQ(shutdown.wait_for(30s), std::future_status::ready) << "shutdown hung";
  shutdown.get();
  EXPECT_NO_THROW(write.wait());
  EXPECT_NO_THROW(read.wait());
  EXPECT_EQ(dst.bytes(kBytes), data);
  expect_error([&] { store.write(written, src.data, MemoryKind::kDevice).wait(); }, ErrorKind::kShutdown);
}

TEST(TierStoreEnqueue, DestructionWithEnqueuedCopiesOutstandingDoesNotHang) {
  GatedCopier copier;
  DeviceBuffer src(copier, kBytes);
  std::vector<Transfer> transfers;
  std::atomic<bool> destroyed{false};
  std::jthread completer([&] {
    while (!destroyed) {
      std::this_thread::sleep_for(20ms);
      copier.complete_all();
    }
  });
  {
    TierStore store(copier, enqueuing_config());
    copier.hold(true);
    for (int i = 0; i < 8; ++i) {
      transfers.push_back(
          store.write(*store.allocate(TierKind::kHost, kBytes), src.data, MemoryKind::kDevice));
    }
  }
  destroyed = true;
  for (const Transfer& t : transfers) {
    ASSERT_TRUE(t.ready());
    EXPECT_NO_THROW(t.wait());
  }
}

TEST(TierStoreEnqueue, ReleaseWhileAnEnqueuedCopyIsPendingIsRefused) {
  GatedCopier copier;
  TierStore store(copier, enqueuing_config());
  DeviceBuffer src(copier, kBytes);
  const Extent extent = *store.allocate(TierKind::kHost, kBytes);
  copier.hold(true);
  const Transfer write = store.write(extent, src.data, MemoryKind::kDevice, "tensor 9");
  expect_error([&] { store.release(extent); }, ErrorKind::kInvalidArgument);
  copier.complete_all();
  wait_or_fail(write);
  store.release(extent);
  EXPECT_EQ(store.report().host_used, 0u);
}

}  // namespace
}  // namespace teraio::io
