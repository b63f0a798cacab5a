// Device-side waits ("settling"): where a host-tier transfer's device side is one enqueued copy,
// the executor hands its waits to the device (release_after / use_after) instead of blocking,
// and the host retires the transfer later. The "device" here is the host: a copier whose copies
// run only when the test lets them, and a tensor memory that frees a block handed back behind
// a copy only once that copy has run, as a stream-ordered allocator would.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime_test_support.hpp"

namespace teraio::runtime {
namespace {

using namespace std::chrono_literals;
using io::CopyDirection;
using testing::offload;
using testing::pattern;
using testing::plan_of;
using testing::prefetch;

constexpr std::uint64_t kBytes = 24 * kKiB + 77;  // not a page multiple
constexpr std::uint64_t kSlot = 28 * kKiB;        // the host tier's extent for kBytes, in whole pages

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

// One copy on the test device.
struct QueuedCopy {
  CopyDirection direction = CopyDirection::kToHost;
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::size_t n = 0;
  bool fails = false;
  bool done = false;  // guarded by the copier's mutex
};

// Copies run when enqueued, or, while held, only when the test completes them: their events stay
// not ready and wait() blocks (the tier store's watcher threads sit in it meanwhile). Each
// direction is one in-order stream; nothing orders the two streams against each other.
class GatedCopier final : public io::DeviceCopier {
 public:
  class Event final : public io::CopyEvent {
   public:
    Event(GatedCopier& copier, std::shared_ptr<QueuedCopy> copy) : copier_(copier), copy_(std::move(copy)) {}
    bool ready() override { return copier_.ran(*copy_); }
    void wait() override {
      std::unique_lock lock(copier_.mutex_);
      copier_.completed_.wait(lock, [&] { return copy_->done; });
      if (copy_->fails) throw Error(ErrorKind::kCuda, "copy failed on the test device");
    }
    io::StreamWait block_stream(void*) override {
      ++copier_.block_streams_;
      return io::StreamWait::kQueued;
    }
    // As if none of it had started: the whole copy is dropped.
    std::size_t abandon(void*) override {
      ++copier_.abandons_;
      return copy_->n;
    }
    const std::shared_ptr<QueuedCopy>& copy() const { return copy_; }

   private:
    GatedCopier& copier_;
    std::shared_ptr<QueuedCopy> copy_;
  };

  void hold(bool on) {
    std::lock_guard lock(mutex_);
    held_ = on;
  }
  // The next copy in `direction` fails: nothing arrives and its event's wait() throws kCuda.
  void fail_next(CopyDirection direction) {
    std::lock_guard lock(mutex_);
    (direction == CopyDirection::kToHost ? fail_to_host_ : fail_to_device_) = true;
  }
  // Runs the queued copies of one stream, in order.
  void complete(CopyDirection direction) {
    {
      std::lock_guard lock(mutex_);
      for (auto it = queued_.begin(); it != queued_.end();) {
        if ((*it)->direction != direction) {
          ++it;
          continue;
        }
        run(**it);
        it = queued_.erase(it);
      }
    }
    completed_.notify_all();
  }
  // Copies to the device first: a read that was let overtake a write of the same bytes gets
  // the stale ones.
  void complete_all() {
    complete(CopyDirection::kToDevice);
    complete(CopyDirection::kToHost);
  }
  bool ran(const QueuedCopy& copy) const {
    std::lock_guard lock(mutex_);
    return copy.done;
  }
  // Whether a copy not run yet reads or writes [p, p + n).
  bool touches(const void* p, std::size_t n) const {
    std::lock_guard lock(mutex_);
    for (const auto& copy : queued_) {
      if (overlaps(copy->dst, copy->n, p, n) || overlaps(copy->src, copy->n, p, n)) return true;
    }
    return false;
  }
  // Copies to the device enqueued while a queued copy to the host was still to write their source.
  int overtakes() const {
    std::lock_guard lock(mutex_);
    return overtakes_;
  }
  int block_streams() const { return block_streams_; }
  int abandons() const { return abandons_; }
  std::size_t queued() const {
    std::lock_guard lock(mutex_);
    return queued_.size();
  }

  std::string name() const override { return "gated"; }
  bool is_cuda() const override { return false; }
  std::unique_ptr<io::CopyEvent> to_host(void* host_dst, const void* device_src, std::size_t n,
                                         io::CopyPriority) override {
    return enqueue(CopyDirection::kToHost, host_dst, device_src, n);
  }
  std::unique_ptr<io::CopyEvent> to_device(void* device_dst, const void* host_src, std::size_t n,
                                           io::CopyPriority) override {
    return enqueue(CopyDirection::kToDevice, device_dst, host_src, n);
  }
  void pin(void*, std::size_t) override {}
  void unpin(void*) override {}
  void* allocate_device(std::size_t n) override { return ::operator new(n == 0 ? 1 : n); }
  void free_device(void* device) override { ::operator delete(device); }

 private:
  std::unique_ptr<io::CopyEvent> enqueue(CopyDirection direction, void* dst, const void* src, std::size_t n) {
    auto copy = std::make_shared<QueuedCopy>();
    copy->direction = direction;
    copy->dst = static_cast<std::byte*>(dst);
    copy->src = static_cast<const std::byte*>(src);
    copy->n = n;
    {
      std::lock_guard lock(mutex_);
      bool& fail = direction == CopyDirection::kToHost ? fail_to_host_ : fail_to_device_;
      copy->fails = std::exchange(fail, false);
      bool stream_busy = false;
      for (const auto& earlier : queued_) {
        stream_busy = stream_busy || earlier->direction == direction;
        if (direction == CopyDirection::kToDevice && earlier->direction == CopyDirection::kToHost &&
            overlaps(earlier->dst, earlier->n, src, n)) {
          ++overtakes_;
        }
      }
      if (held_ || stream_busy) {
        queued_.push_back(copy);
      } else {
        run(*copy);
      }
    }
    completed_.notify_all();
    return std::make_unique<Event>(*this, std::move(copy));
  }
  // Under the mutex. A failed copy leaves junk behind, as a half-done DMA would.
  static void run(QueuedCopy& copy) {
    if (copy.fails) {
      std::memset(copy.dst, 0xEE, copy.n / 2);
    } else {
      std::memcpy(copy.dst, copy.src, copy.n);
    }
    copy.done = true;
  }

  mutable std::mutex mutex_;
  std::condition_variable completed_;
  std::deque<std::shared_ptr<QueuedCopy>> queued_;
  bool held_ = false;
  bool fail_to_host_ = false;
  bool fail_to_device_ = false;
  int overtakes_ = 0;
  std::atomic<int> block_streams_{0};
  std::atomic<int> abandons_{0};
};

// testing::FakeMemory on the test device: release_after and use_after only make the "stream"
// wait (block_stream), and a block handed back behind a copy out is freed once that copy ran.
class DeviceMemory final : public TensorMemory {
 public:
  explicit DeviceMemory(GatedCopier& copier) : copier_(copier) {}

  void add(TensorId id, std::size_t bytes) {
    sizes_[id] = bytes;
    blocks_[id] = std::make_unique<Block>(pattern(bytes, static_cast<std::uint32_t>(id)));
  }
  void* data(TensorId id) override {
    auto& block = blocks_.at(id);
    if (!block) ADD_FAILURE() << "data() of released tensor " << id;
    return block ? block->data() : nullptr;
  }
  bool alive(TensorId) override { return true; }
  void before_copy_out(TensorId id) override { ++copy_outs_[id]; }
  void release(TensorId id) override {
    auto& block = blocks_.at(id);
    if (!block) {
      ADD_FAILURE() << "double release of tensor " << id;
      return;
    }
    if (copier_.touches(block->data(), block->size())) {
      ADD_FAILURE() << "tensor " << id << " released on the host while a copy still uses its memory";
      unsafe_.push_back(std::move(block));  // freeing it would let the copy touch freed memory
      return;
    }
    block.reset();
  }
  void release_after(TensorId id, io::CopyEvent& copied_out) override {
    if (std::exchange(fail_release_after_, false)) {
      throw Error(ErrorKind::kCuda, "cudaStreamWaitEvent failed on the test device");
    }
    ++release_afters_[id];
    copied_out.block_stream(nullptr);
    auto* event = dynamic_cast<GatedCopier::Event*>(&copied_out);
    auto& block = blocks_.at(id);
    if (event == nullptr || !block) {
      ADD_FAILURE() << "release_after of tensor " << id << " without its memory or a test copy";
      return;
    }
    freeing_.push_back(Freeing{event->copy(), std::move(block)});
  }
  void use_after(TensorId id, io::CopyEvent& copied_in) override {
    ++use_afters_[id];
    copied_in.block_stream(nullptr);
  }
  std::uint64_t cancel_copy_out(TensorId id, io::CopyEvent& copying_out) override {
    ++cancels_[id];
    return copying_out.abandon(nullptr);
  }
  void* reallocate(TensorId id) override {
    auto& block = blocks_.at(id);
    if (block) ADD_FAILURE() << "reallocate() of tensor " << id << " that still holds memory";
    block = std::make_unique<Block>(sizes_.at(id), std::byte{0xCD});
    return block->data();
  }

  // The next release_after throws before doing anything, as when the stream wait cannot be queued.
  void fail_next_release_after() { fail_release_after_ = true; }

  bool holds(TensorId id) const { return blocks_.at(id) != nullptr; }
  bool intact(TensorId id) const {
    const auto& block = blocks_.at(id);
    return block && *block == pattern(sizes_.at(id), static_cast<std::uint32_t>(id));
  }
  int release_afters(TensorId id) const { return count(release_afters_, id); }
  int use_afters(TensorId id) const { return count(use_afters_, id); }
  int cancels(TensorId id) const { return count(cancels_, id); }
  int copy_outs(TensorId id) const { return count(copy_outs_, id); }
  // Blocks handed back behind a copy out that has not run yet.
  std::size_t freeing() {
    std::erase_if(freeing_, [&](const Freeing& f) { return copier_.ran(*f.copy); });
    return freeing_.size();
  }

 private:
  using Block = std::vector<std::byte>;
  struct Freeing {
    std::shared_ptr<QueuedCopy> copy;
    std::unique_ptr<Block> block;
  };
  static int count(const std::map<TensorId, int>& counts, TensorId id) {
    auto found = counts.find(id);
    return found == counts.end() ? 0 : found->second;
  }

  GatedCopier& copier_;
  std::map<TensorId, std::size_t> sizes_;
  std::map<TensorId, std::unique_ptr<Block>> blocks_;
  std::vector<Freeing> freeing_;
  std::vector<std::unique_ptr<Block>> unsafe_;
  std::map<TensorId, int> release_afters_;
  std::map<TensorId, int> use_afters_;
  std::map<TensorId, int> cancels_;
  std::map<TensorId, int> copy_outs_;
  bool fail_release_after_ = false;
};

// A host tier only, whose transfers of "device" memory enqueue their copy (as on CUDA).
class DeviceRig {
 public:
  explicit DeviceRig(std::uint64_t budget, std::uint64_t host_capacity = 1 * kMiB)
      : store_(copier_, config(host_capacity)), memory_(copier_), executor_(store_, memory_, {budget}) {}
  // Whatever a test left held runs, so that the executor and the store can drain.
  ~DeviceRig() {
    copier_.hold(false);
    copier_.complete_all();
  }

  GatedCopier& copier() { return copier_; }
  io::TierStore& store() { return store_; }
  DeviceMemory& memory() { return memory_; }
  Executor& executor() { return executor_; }
  void add(TensorId id, std::uint64_t bytes) {
    memory_.add(id, bytes);
    executor_.add_tensor(id, bytes);
  }
  std::uint64_t host_used() const { return store_.report().host_used; }

  // Runs `call` while the copies are held; true when it returned without waiting for them. One
  // that waits is freed after a while (the copies run) so that the test fails instead of hanging.
  bool returns_while_held(const std::function<void()>& call) {
    std::future<void> done = std::async(std::launch::async, call);
    if (done.wait_for(5s) == std::future_status::ready) {
      done.get();
      return true;
    }
    copier_.hold(false);
    copier_.complete_all();
    done.get();
    return false;
  }
  // Completes one stream's copies from another thread after `delay`: the operator thread is
  // expected to wait for them meanwhile.
  std::jthread complete_later(CopyDirection direction, std::chrono::milliseconds delay) {
    return std::jthread([this, direction, delay] {
      std::this_thread::sleep_for(delay);
      copier_.complete(direction);
    });
  }

 private:
  static io::EngineConfig config(std::uint64_t host_capacity) {
    io::EngineConfig c;
    c.host_capacity = host_capacity;
    c.transfer_threads = 2;
    c.enqueue_host_copies = true;
    return c;
  }

  GatedCopier copier_;
  io::TierStore store_;
  DeviceMemory memory_;
  Executor executor_;
};

// Tensors 1, 2, 3 under a budget of two, in reactive mode: the next operator evicts tensor 1.
void add_three_over_a_budget_of_two(DeviceRig& rig) {
  rig.executor().set_mode(Mode::kReactive);
  rig.executor().begin_step();
  for (TensorId id : {1, 2, 3}) rig.add(id, kBytes);
}

// Runs operator 0 (using tensors 1, 2, 3) and operator 1 of a planned step, letting the plan's
// offloads after operator 0 finish: the tests of the wait for tier room start from full tiers.
void run_until_offloads_done(Executor& ex) {
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const TensorId all[] = {1, 2, 3};
  ex.before_op(0, all);
  ex.after_op(0, all);
  ex.before_op(1, {});
  ex.drain();
  ex.after_op(1, {});
}

// Lets every copy run, drops tensor 4 (an output) and brings tensors 1, 2, 3 back: each must
// hold its bytes, and no copy in may have overtaken the copy out of the same bytes.
void expect_tensors_back_intact(DeviceRig& rig) {
  rig.copier().hold(false);
  rig.copier().complete_all();
  rig.executor().remove_tensor(4);
  rig.executor().fetch_all();
  for (TensorId id : {1, 2, 3}) EXPECT_TRUE(rig.memory().intact(id)) << "tensor " << id;
  EXPECT_EQ(rig.copier().overtakes(), 0);
}

TEST(ExecutorDeviceWait, ReactiveEvictionHandsTheWaitToTheDevice) {
  DeviceRig rig(2 * kBytes);
  Executor& ex = rig.executor();
  add_three_over_a_budget_of_two(rig);
  rig.copier().hold(true);
  const TensorId used[] = {3};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(0, used); })) << "eviction waited on the host";
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_EQ(ex.location(2), Location::kDevice);
  EXPECT_LE(ex.resident_bytes(), ex.budget());
  EXPECT_EQ(rig.memory().release_afters(1), 1);
  EXPECT_FALSE(rig.memory().holds(1));
  EXPECT_EQ(rig.memory().freeing(), 1u);  // the block waits for its copy out
  EXPECT_GE(rig.copier().block_streams(), 1);
  EXPECT_GT(rig.host_used(), 0u);
  const StepStats evicted = ex.end_step();
  EXPECT_EQ(evicted.stall_s, 0.0);
  EXPECT_TRUE(evicted.stalls.empty());
  EXPECT_EQ(evicted.evictions, 1u);
  EXPECT_GE(evicted.device_waits, 1u);
  EXPECT_EQ(evicted.bytes_to_host, kBytes);
  EXPECT_TRUE(evicted.transfers.empty());  // recorded when the host sees the copy done

  rig.copier().complete_all();
  EXPECT_EQ(rig.memory().freeing(), 0u);
  ex.after_op(0, used);
  ex.drain();
  const StepStats retired = ex.end_step();
  ASSERT_EQ(retired.transfers.size(), 1u);
  EXPECT_EQ(retired.transfers[0].tensor, 1u);
  EXPECT_EQ(retired.transfers[0].direction, plan::Direction::kOffload);
  EXPECT_FALSE(retired.transfers[0].planned);
  EXPECT_LE(retired.transfers[0].start_s, retired.transfers[0].end_s);

  rig.copier().hold(false);
  const TensorId one[] = {1};
  ex.fetch(one);
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_LE(ex.resident_bytes(), ex.budget());
  EXPECT_EQ(rig.copier().overtakes(), 0);
}

TEST(ExecutorDeviceWait, PlannedPrefetchIsUsedBehindItsCopyAndItsExtentWaitsForIt) {
  DeviceRig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 1), prefetch(1, kBytes, plan::Tier::kHost, 2, 3)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const TensorId all[] = {1, 2};
  ex.before_op(0, all);
  ex.after_op(0, all);
  ex.before_op(1, {});
  ex.drain();  // the offload is seen done: its memory goes back on the host
  ASSERT_EQ(ex.location(1), Location::kHost);
  EXPECT_FALSE(rig.memory().holds(1));
  EXPECT_EQ(rig.memory().release_afters(1), 0);
  ex.after_op(1, {});

  rig.copier().hold(true);
  ex.before_op(2, {});
  EXPECT_EQ(ex.location(1), Location::kFetching);
  ex.after_op(2, {});
  const TensorId one[] = {1};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(3, one); }))
      << "the prefetch was waited for on the host";
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_EQ(rig.memory().use_afters(1), 1);
  EXPECT_GE(rig.copier().block_streams(), 1);
  EXPECT_FALSE(rig.memory().intact(1));  // the copy in has not run: only the device waits for it
  ASSERT_TRUE(rig.returns_while_held([&] { ex.after_op(3, one); }));
  EXPECT_GT(rig.host_used(), 0u) << "the extent was released while its copy was still reading it";
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.device_waits, 1u);
  EXPECT_EQ(stats.planned_offloads, 1u);
  EXPECT_EQ(stats.planned_prefetches, 1u);
  EXPECT_EQ(stats.demand_fetches, 0u);
  for (const StallSpan& stall : stats.stalls) EXPECT_NE(stall.op, 3u) << "operator 3 stalled";

  rig.copier().complete_all();
  ex.drain();
  EXPECT_EQ(rig.host_used(), 0u);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_TRUE(rig.memory().intact(2));
  const StepStats retired = ex.end_step();
  ASSERT_EQ(retired.transfers.size(), 1u);
  EXPECT_EQ(retired.transfers[0].direction, plan::Direction::kPrefetch);
  EXPECT_TRUE(retired.transfers[0].planned);
}

// Room for two tensors on the host, both taken: tensor 2 is out, and tensor 1 is coming back
// (its copy in held). An eviction of tensor 3 then finds no tier with room. Tensor 1's extent
// is free as soon as its copy in is done, so the eviction waits for that copy (stall cause
// tier-room) instead of failing the step: while the prefetch is still in flight (the host
// finishes it), after the device has taken the wait over (the host retires it), and for a
// prefetch that keeps its copy (its copy is given up once it is done).
TEST(ExecutorDeviceWait, AnEvictionFindingTheTiersFullWaitsForAPrefetchToGiveItsRoomBack) {
  enum class Case { kInFlight, kSettled, kKeptCopy };
  for (const Case c : {Case::kInFlight, Case::kSettled, Case::kKeptCopy}) {
    const bool settled = c == Case::kSettled;
    SCOPED_TRACE(
        settled ? "prefetch settled on the device"
                : (c == Case::kKeptCopy ? "prefetch keeping its copy, in flight" : "prefetch in flight"));
    DeviceRig rig(3 * kBytes, 2 * kSlot);
    Executor& ex = rig.executor();
    for (TensorId id : {1, 2, 3}) rig.add(id, kBytes);
    plan::Migration fetch_one = prefetch(1, kBytes, plan::Tier::kHost, 2, 3);
    fetch_one.kept_copy = c == Case::kKeptCopy;
    ex.set_plan(plan_of(
        {offload(1, kBytes, plan::Tier::kHost, 1), offload(2, kBytes, plan::Tier::kHost, 1), fetch_one}));
    run_until_offloads_done(ex);
    ASSERT_EQ(rig.host_used(), 2 * kSlot);

    rig.copier().hold(true);
    ex.before_op(2, {});
    ASSERT_EQ(ex.location(1), Location::kFetching);
    const TensorId one[] = {1};
    std::span<const TensorId> used;
    if (settled) {
      ex.after_op(2, {});
      ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(3, one); }));
      ASSERT_EQ(ex.location(1), Location::kDevice);
      used = one;
    }
    rig.add(4, 2 * kBytes);  // an output: 2 + 1 resident + 2 over a budget of 3
    std::future<void> evicted = std::async(std::launch::async, [&] { ex.after_op(settled ? 3 : 2, used); });
    ASSERT_EQ(evicted.wait_for(200ms), std::future_status::timeout) << "the eviction did not wait for room";
    rig.copier().complete(CopyDirection::kToDevice);
    evicted.get();
    // Tensor 3 went: tensor 1, used as long ago but fetched for the room, stays.
    EXPECT_EQ(ex.location(3), Location::kHost);
    EXPECT_EQ(ex.location(1), Location::kDevice);
    EXPECT_LE(ex.resident_bytes(), ex.budget());
    const StepStats stats = ex.end_step();
    EXPECT_GT(stats.stall_by_cause_s[static_cast<std::size_t>(StallCause::kTierRoom)], 0.0);
    EXPECT_EQ(stats.evictions, 1u);
    EXPECT_EQ(stats.copies_given_up, c == Case::kKeptCopy ? 1u : 0u);

    expect_tensors_back_intact(rig);
  }
}

// As above, with two copies that give room back: tensor 1's copy in (settled on the device,
// older) and tensor 2's copy out, taken back before it finished (newer). Only the copy out
// finishes: the eviction takes its room and does not wait for the older copy in.
TEST(ExecutorDeviceWait, AnEvictionWaitingForTierRoomTakesWhicheverCopyFinishesFirst) {
  DeviceRig rig(4 * kBytes, 2 * kSlot);
  Executor& ex = rig.executor();
  for (TensorId id : {1, 2, 3}) rig.add(id, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kHost, 1), offload(2, kBytes, plan::Tier::kHost, 2),
                       prefetch(1, kBytes, plan::Tier::kHost, 2, 3)}));
  run_until_offloads_done(ex);

  rig.copier().hold(true);
  ex.before_op(2, {});
  ASSERT_EQ(ex.location(1), Location::kFetching);
  ASSERT_EQ(ex.location(2), Location::kOffloading);
  ex.after_op(2, {});
  const TensorId both[] = {1, 2};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(3, both); }));
  ASSERT_EQ(ex.location(1), Location::kDevice);
  ASSERT_EQ(ex.location(2), Location::kDevice);
  ASSERT_EQ(rig.host_used(), 2 * kSlot);  // both extents wait for their copies

  rig.add(4, 2 * kBytes);  // 3 resident + 2 over a budget of 4: tensor 3 must go
  std::future<void> evicted = std::async(std::launch::async, [&] { ex.after_op(3, both); });
  ASSERT_EQ(evicted.wait_for(200ms), std::future_status::timeout) << "the eviction did not wait for room";
  rig.copier().complete(CopyDirection::kToHost);
  if (evicted.wait_for(5s) != std::future_status::ready) {
    rig.copier().complete_all();  // frees the operator thread, so that the test fails instead of hanging
    evicted.get();
    FAIL() << "the eviction waited for the older copy in";
  }
  evicted.get();
  EXPECT_EQ(ex.location(3), Location::kHost);
  EXPECT_FALSE(rig.memory().intact(1)) << "tensor 1's copy in was meant to stay held";
  const StepStats stats = ex.end_step();
  EXPECT_GT(stats.stall_by_cause_s[static_cast<std::size_t>(StallCause::kTierRoom)], 0.0);
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.cancelled_offloads, 1u);

  expect_tensors_back_intact(rig);
}

// A planned prefetch needing an eviction that finds the tiers full waits for room too: skipping
// it would leave its use a demand fetch, which needs the same room. (On W3, session 15, the one
// wait for tier room came on such a prefetch, of a 2 GB weight.)
TEST(ExecutorDeviceWait, APlannedPrefetchFindingTheTiersFullWaitsForRoom) {
  DeviceRig rig(3 * kBytes, 2 * kSlot);
  Executor& ex = rig.executor();
  for (TensorId id : {1, 2, 3}) rig.add(id, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 1), offload(2, kBytes, plan::Tier::kHost, 1),
               prefetch(1, kBytes, plan::Tier::kHost, 2, 3), prefetch(2, kBytes, plan::Tier::kHost, 2, 4)}));
  run_until_offloads_done(ex);
  ASSERT_EQ(rig.host_used(), 2 * kSlot);

  rig.add(4, kBytes);  // 3 and 4 resident: tensor 1 fits the budget of 3, tensor 2 does not
  rig.copier().hold(true);
  // Tensor 2's prefetch needs tensor 3 or 4 out, and no tier has room until tensor 1's copy in
  // (held) is done.
  std::future<void> issued = std::async(std::launch::async, [&] { ex.before_op(2, {}); });
  ASSERT_EQ(issued.wait_for(200ms), std::future_status::timeout) << "the prefetch did not wait for room";
  rig.copier().complete(CopyDirection::kToDevice);
  issued.get();
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_EQ(ex.location(2), Location::kFetching);
  EXPECT_EQ(ex.location(3), Location::kHost);  // least recently used: 4 was added after it
  EXPECT_LE(ex.resident_bytes(), ex.budget());
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.planned_prefetches, 2u);
  EXPECT_EQ(stats.skipped, 0u);
  EXPECT_GT(stats.stall_by_cause_s[static_cast<std::size_t>(StallCause::kTierRoom)], 0.0);

  expect_tensors_back_intact(rig);
}

TEST(ExecutorDeviceWait, OffloadTakenBackIsResidentAtOnceAndItsExtentGoesBackLater) {
  DeviceRig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kHost, 1)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const TensorId all[] = {1, 2};
  ex.before_op(0, all);
  ex.after_op(0, all);
  rig.copier().hold(true);
  ex.before_op(1, {});
  ASSERT_EQ(ex.location(1), Location::kOffloading);
  ex.after_op(1, {});
  const TensorId one[] = {1};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(2, one); })) << "the take-back waited on the host";
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(rig.memory().release_afters(1), 0);
  // The program may free the tensor from here on: the memory's later uses must wait for the
  // copy still reading it (on the H100 the allocator unmapped such a block before the copy
  // was issued), and the copy's bytes not yet started are not wanted.
  EXPECT_EQ(rig.memory().cancels(1), 1);
  EXPECT_EQ(rig.copier().abandons(), 1);
  EXPECT_EQ(ex.resident_bytes(), 2 * kBytes);
  EXPECT_GT(rig.host_used(), 0u);  // the copy out still writes the extent
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.cancelled_offloads, 1u);
  EXPECT_EQ(stats.bytes_abandoned, kBytes);
  EXPECT_EQ(stats.stall_s, 0.0);

  rig.copier().complete_all();
  ex.drain();
  EXPECT_EQ(rig.host_used(), 0u);
  EXPECT_EQ(ex.end_step().transfers.size(), 1u);
  EXPECT_TRUE(rig.memory().intact(1));
}

TEST(ExecutorDeviceWait, FetchWaitsForItsSettlingCopyOutInsteadOfOvertakingIt) {
  DeviceRig rig(2 * kBytes);
  Executor& ex = rig.executor();
  add_three_over_a_budget_of_two(rig);
  rig.copier().hold(true);
  const TensorId three[] = {3};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(0, three); }));
  ASSERT_EQ(ex.location(1), Location::kHost);
  ex.after_op(0, three);
  {
    // The fetch of tensor 1 evicts tensor 2 behind the device, then must see 1's copy out done.
    std::jthread completer = rig.complete_later(CopyDirection::kToHost, 100ms);
    const TensorId one[] = {1};
    ex.before_op(1, one);
  }
  EXPECT_EQ(rig.copier().overtakes(), 0) << "a read of the extent was enqueued before its write had run";
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_EQ(ex.location(2), Location::kHost);
  rig.copier().complete_all();
  ex.drain();
  EXPECT_TRUE(rig.memory().intact(1));
  const StepStats stats = ex.end_step();
  EXPECT_EQ(stats.demand_fetches, 1u);
  EXPECT_GT(stats.stall_s, 0.0);  // the operator thread waited for the copy out

  rig.copier().hold(false);
  const TensorId two[] = {2};
  ex.fetch(two);
  EXPECT_TRUE(rig.memory().intact(2));
  EXPECT_EQ(rig.copier().overtakes(), 0);
}

// A tensor the program frees while its copy out is settling: nobody needs those bytes, so the
// host does not wait for the copy; the extent goes back once the host sees it done.
TEST(ExecutorDeviceWait, RemovingATensorLeavesItsSettlingCopyOutToFinishThenReleasesTheExtent) {
  DeviceRig rig(2 * kBytes);
  Executor& ex = rig.executor();
  add_three_over_a_budget_of_two(rig);
  rig.copier().hold(true);
  const TensorId three[] = {3};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(0, three); }));
  ASSERT_EQ(ex.location(1), Location::kHost);
  ASSERT_GT(rig.host_used(), 0u);
  ASSERT_TRUE(rig.returns_while_held([&] { EXPECT_NO_THROW(ex.remove_tensor(1)); }))
      << "forgetting waited on the host";
  EXPECT_FALSE(ex.contains(1));
  EXPECT_GT(rig.host_used(), 0u);  // still written by the copy out
  rig.copier().complete(CopyDirection::kToHost);
  EXPECT_NO_THROW(ex.drain());
  EXPECT_EQ(rig.host_used(), 0u);
  EXPECT_EQ(rig.memory().freeing(), 0u);
  EXPECT_NO_THROW(ex.drain());
  EXPECT_EQ(ex.resident_bytes(), 2 * kBytes);
  const StepStats stats = ex.end_step();
  // Only the drain may have waited (for the watcher to see the copy done), never the forget.
  EXPECT_EQ(stats.stall_by_cause_s[static_cast<std::size_t>(StallCause::kForget)], 0.0);
  EXPECT_EQ(stats.stall_by_cause_s[static_cast<std::size_t>(StallCause::kOrdering)], 0.0);
  EXPECT_DOUBLE_EQ(stats.stall_by_cause_s[static_cast<std::size_t>(StallCause::kDrain)], stats.stall_s);
}

TEST(ExecutorDeviceWait, AnOffloadFinishingBetweenOperatorsIsRetiredAtTheNextOne) {
  // The executor looks at its transfers only when one has finished since it last looked: after
  // operators that found the copy still queued, its finishing alone must make the next
  // operator retire it (free its memory), without a drain.
  DeviceRig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kHost, 1)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  rig.copier().hold(true);
  ex.before_op(1, {});
  ex.after_op(1, {});
  ex.before_op(2, {});
  ex.after_op(2, {});
  ASSERT_EQ(ex.location(1), Location::kOffloading);
  const std::uint64_t finished = io::Transfer::finished_count();
  rig.copier().hold(false);
  rig.copier().complete(CopyDirection::kToHost);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (io::Transfer::finished_count() == finished && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GT(io::Transfer::finished_count(), finished);
  EXPECT_EQ(ex.location(1), Location::kOffloading);  // nothing looked since
  ex.before_op(3, {});
  EXPECT_EQ(ex.location(1), Location::kHost);
  EXPECT_FALSE(rig.memory().holds(1));
  EXPECT_EQ(ex.resident_bytes(), 0u);
  EXPECT_EQ(ex.end_step().transfers.size(), 1u);
}

TEST(ExecutorDeviceWait, RemovingATensorWhosePrefetchSettlesReleasesTheExtent) {
  DeviceRig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 1), prefetch(1, kBytes, plan::Tier::kHost, 2, 3)}));
  ex.set_mode(Mode::kPlanned);
  ex.before_op(1, {});
  ex.drain();
  rig.copier().hold(true);
  ex.before_op(2, {});
  const TensorId one[] = {1};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(3, one); }));
  ASSERT_GT(rig.host_used(), 0u);
  ASSERT_TRUE(rig.returns_while_held([&] { EXPECT_NO_THROW(ex.remove_tensor(1)); }));
  EXPECT_EQ(ex.resident_bytes(), 0u);
  EXPECT_GT(rig.host_used(), 0u);  // still read by the copy in
  rig.copier().complete(CopyDirection::kToDevice);
  EXPECT_NO_THROW(ex.drain());
  EXPECT_EQ(rig.host_used(), 0u);
}

// Polls an executor call until it throws (the store finishes a transfer on its own thread).
template <typename Call>
void expect_error_soon(Call&& call, ErrorKind kind) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      return;
    }
    std::this_thread::sleep_for(1ms);
  }
  ADD_FAILURE() << "no error within 10 s";
}

TEST(ExecutorDeviceWait, FailedCopyOutSurfacesFromALaterOperatorAndTheTensorIsNotReadBack) {
  DeviceRig rig(2 * kBytes);
  Executor& ex = rig.executor();
  add_three_over_a_budget_of_two(rig);
  rig.copier().hold(true);
  rig.copier().fail_next(CopyDirection::kToHost);
  const TensorId three[] = {3};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(0, three); }));
  ASSERT_EQ(ex.location(1), Location::kHost);
  rig.copier().complete_all();
  rig.copier().hold(false);
  expect_error_soon([&] { ex.after_op(0, three); }, ErrorKind::kCuda);
  EXPECT_NO_THROW(ex.drain());
  // The extent holds junk: the fetch is refused rather than handing it out.
  const TensorId one[] = {1};
  try {
    ex.fetch(one);
    ADD_FAILURE() << "tensor 1 was fetched from a failed write";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  }
  EXPECT_NE(ex.location(1), Location::kDevice);
  EXPECT_LE(ex.resident_bytes(), ex.budget());
}

TEST(ExecutorDeviceWait, FailedCopyInSurfacesFromDrain) {
  DeviceRig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(
      plan_of({offload(1, kBytes, plan::Tier::kHost, 1), prefetch(1, kBytes, plan::Tier::kHost, 2, 3)}));
  ex.set_mode(Mode::kPlanned);
  ex.before_op(1, {});
  ex.drain();
  rig.copier().hold(true);
  rig.copier().fail_next(CopyDirection::kToDevice);
  ex.before_op(2, {});
  const TensorId one[] = {1};
  ASSERT_TRUE(rig.returns_while_held([&] { ex.before_op(3, one); }));
  EXPECT_EQ(ex.location(1), Location::kDevice);
  rig.copier().complete_all();
  try {
    ex.drain();
    ADD_FAILURE() << "the failed copy in was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCuda) << e.what();
  }
  EXPECT_NO_THROW(ex.drain());
  EXPECT_EQ(rig.host_used(), 0u);
}

TEST(ExecutorDeviceWait, FailureToHandTheWaitToTheDeviceLeavesTheTransferInFlight) {
  DeviceRig rig(2 * kBytes);
  Executor& ex = rig.executor();
  add_three_over_a_budget_of_two(rig);
  rig.memory().fail_next_release_after();
  const TensorId three[] = {3};
  try {
    ex.before_op(0, three);
    ADD_FAILURE() << "the failed release_after was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCuda) << e.what();
  }
  ex.drain();
  // Stuck here, the next use would wait forever for a transfer the executor no longer holds.
  ASSERT_NE(ex.location(1), Location::kOffloading) << "tensor 1 is offloading with no transfer in flight";
  const TensorId one[] = {1};
  ex.fetch(one);
  EXPECT_TRUE(rig.memory().intact(1));
}

}  // namespace
}  // namespace teraio::runtime
