// Shared helpers of the runtime tests: tensor memory over plain buffers (released memory is
// really freed, so a use after release is caught by the sanitizers) and a small tier store.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "io/io_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/tier_store.hpp"
#include "teraio/runtime/executor.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::runtime::testing {

using teraio::testing::pattern;
using teraio::testing::TempDir;

// Each tensor starts filled with its own pattern; a fresh allocation is filled with junk so
// that a fetch which does not deliver every byte is caught.
class FakeMemory final : public TensorMemory {
 public:
  void add(TensorId id, std::size_t bytes) {
    sizes_[id] = bytes;
    buffers_[id] = std::make_unique<std::vector<std::byte>>(pattern(bytes, static_cast<std::uint32_t>(id)));
    hold(static_cast<std::int64_t>(bytes));
  }
  void* data(TensorId id) override {
    auto& buffer = buffers_.at(id);
    if (!buffer) ADD_FAILURE() << "data() of released tensor " << id;
    return buffer ? buffer->data() : nullptr;
  }
  bool alive(TensorId id) override { return freed_.count(id) == 0; }
  // The program freed the tensor without telling the executor.
  void free_silently(TensorId id) { freed_.insert(id); }
  void before_copy_out(TensorId id) override {
    if (freed_.count(id) != 0) ADD_FAILURE() << "copy out of freed tensor " << id;
    ++copy_outs_[id];
  }
  void release(TensorId id) override {
    auto& buffer = buffers_.at(id);
    if (!buffer) {
      ADD_FAILURE() << "double release of tensor " << id;
      return;
    }
    std::fill(buffer->begin(), buffer->end(), std::byte{0xDE});
    if (keeping_) {
      spare_bytes_ += buffer->size();
      spares_.emplace(buffer->size(), std::move(buffer));
      return;
    }
    hold(-static_cast<std::int64_t>(buffer->size()));
    buffer.reset();
  }
  void* reallocate(TensorId id) override {
    auto& buffer = buffers_.at(id);
    if (buffer) ADD_FAILURE() << "reallocate() of tensor " << id << " that still holds memory";
    if (const auto kept = spares_.find(sizes_.at(id)); kept != spares_.end()) {
      buffer = std::move(kept->second);
      spares_.erase(kept);
      spare_bytes_ -= buffer->size();
      ++blocks_reused_;
      std::fill(buffer->begin(), buffer->end(), std::byte{0xCD});
      return buffer->data();
    }
    // Only the allocator refuses: a spare block of the size is there without it.
    if (refusals_ > 0) {
      --refusals_;
      throw Error(ErrorKind::kOutOfMemory, "fake allocator: no block for tensor " + std::to_string(id));
    }
    buffer = std::make_unique<std::vector<std::byte>>(sizes_.at(id), std::byte{0xCD});
    hold(static_cast<std::int64_t>(sizes_.at(id)));
    return buffer->data();
  }

  void trim() override {
    ++trims_;
    hold(-static_cast<std::int64_t>(spare_bytes_));
    spares_.clear();
    spare_bytes_ = 0;
  }
  // From now on release() keeps blocks for a later reallocate() of their size, as
  // StorageMemory does with reuse_blocks.
  void keep_released_blocks() { keeping_ = true; }
  std::uint64_t spare_bytes() const override { return spare_bytes_; }
  bool has_spare(std::uint64_t bytes) const override { return spares_.count(bytes) != 0; }
  std::uint64_t give_back_spares(std::uint64_t bytes, std::uint64_t for_fetch) override {
    std::uint64_t given = 0;
    bool spared = false;
    for (auto block = spares_.end(); block != spares_.begin() && given < bytes;) {  // largest first
      --block;
      if (block->first == for_fetch && !spared) {
        spared = true;
        continue;
      }
      given += block->first;
      spare_bytes_ -= block->first;
      hold(-static_cast<std::int64_t>(block->first));
      block = spares_.erase(block);
    }
    return given;
  }
  int blocks_reused() const { return blocks_reused_; }
  // The most memory held at once: every tensor's buffer and every spare block.
  std::uint64_t peak_held() const { return peak_held_; }
  void reset_peak_held() { peak_held_ = held_; }
  // The next `count` reallocate() calls fail as a full device allocator's would.
  void refuse_allocations(int count) { refusals_ = count; }
  int trims() const { return trims_; }

  bool holds(TensorId id) const { return buffers_.at(id) != nullptr; }
  // Holds memory with exactly the tensor's original bytes.
  bool intact(TensorId id) const {
    const auto& buffer = buffers_.at(id);
    return buffer && *buffer == pattern(sizes_.at(id), static_cast<std::uint32_t>(id));
  }
  int copy_outs(TensorId id) const {
    auto found = copy_outs_.find(id);
    return found == copy_outs_.end() ? 0 : found->second;
  }

 private:
  std::map<TensorId, std::size_t> sizes_;
  std::set<TensorId> freed_;
  std::map<TensorId, std::unique_ptr<std::vector<std::byte>>> buffers_;
  std::map<TensorId, int> copy_outs_;
  int refusals_ = 0;
  int trims_ = 0;
  bool keeping_ = false;
  std::multimap<std::uint64_t, std::unique_ptr<std::vector<std::byte>>> spares_;
  std::uint64_t spare_bytes_ = 0;
  int blocks_reused_ = 0;
  std::uint64_t held_ = 0;
  std::uint64_t peak_held_ = 0;
  void hold(std::int64_t bytes) {
    held_ = static_cast<std::uint64_t>(static_cast<std::int64_t>(held_) + bytes);
    peak_held_ = std::max(peak_held_, held_);
  }
};

struct RigOptions {
  std::uint64_t host_capacity = 256 * kKiB;
  std::uint64_t ssd_capacity = 1 * kMiB;
  io::testing::FaultyBackend::Faults faults;

  // Tiers that each hold one tensor of `bytes`: the third offload finds both full.
  static RigOptions one_tensor_per_tier(std::uint64_t bytes) {
    RigOptions options;
    options.host_capacity = options.ssd_capacity = bytes;
    return options;
  }
};

// A tier store over a temporary SSD directory (POSIX backend behind a fault injector), the
// fake memory, and the executor on top.
class Rig {
 public:
  explicit Rig(std::uint64_t budget, RigOptions options = {})
      : copier_(io::make_host_copier()),
        store_(*copier_, config(options)),
        executor_(store_, memory_, {budget}) {}

  io::TierStore& store() { return store_; }
  FakeMemory& memory() { return memory_; }
  Executor& executor() { return executor_; }

  void add(TensorId id, std::uint64_t bytes) {
    memory_.add(id, bytes);
    executor_.add_tensor(id, bytes);
  }
  std::uint64_t host_used() const { return store_.report().host_used; }
  std::uint64_t ssd_used() const { return store_.report().paths.at(0).used; }

 private:
  io::EngineConfig config(const RigOptions& options) {
    io::EngineConfig c;
    c.host_capacity = options.host_capacity;
    c.ssd_paths = {dir_.path()};
    c.ssd_capacity_per_path = options.ssd_capacity;
    c.stripe_unit = 64 * kKiB;
    c.chunk_bytes = 16 * kKiB;
    c.bounce_pool_bytes = 64 * kKiB;
    c.backend = io::BackendChoice::kPosix;
    c.io_threads = 2;
    c.transfer_threads = 2;
    c.chunks_in_flight = 4;
    const auto faults = options.faults;
    c.wrap_backend = [faults](std::unique_ptr<io::IoBackend> real, const std::string&) {
      return std::unique_ptr<io::IoBackend>(
          std::make_unique<io::testing::FaultyBackend>(std::move(real), faults));
    };
    return c;
  }

  TempDir dir_;
  std::unique_ptr<io::DeviceCopier> copier_;
  io::TierStore store_;
  FakeMemory memory_;
  Executor executor_;
};

inline plan::Migration offload(TensorId id, std::uint64_t bytes, plan::Tier tier, OpIndex at) {
  return plan::Migration{id, bytes, plan::Direction::kOffload, tier, at, at, false};
}
inline plan::Migration prefetch(TensorId id, std::uint64_t bytes, plan::Tier tier, OpIndex at,
                                OpIndex deadline) {
  return plan::Migration{id, bytes, plan::Direction::kPrefetch, tier, at, deadline, false};
}
// A traced tensor of `bytes` bytes used by operators `uses`, and a trace of `ops` 1 ms operators
// over such tensors: profiles for NextUses.
inline trace::Tensor traced(TensorId id, std::uint64_t bytes, std::vector<OpIndex> uses, bool persistent) {
  trace::Tensor one;
  one.id = id;
  one.bytes = bytes;
  one.persistent = persistent;
  one.uses = std::move(uses);
  return one;
}
inline trace::Trace trace_of(std::vector<trace::Tensor> tensors, std::size_t ops) {
  trace::Trace t;
  t.ops.resize(ops, trace::Operator{"aten::op", 1e-3});
  t.tensors = std::move(tensors);
  return t;
}

inline plan::Plan plan_of(std::vector<plan::Migration> migrations) {
  plan::Plan p;
  p.migrations = std::move(migrations);
  p.feasible = true;
  return p;
}

}  // namespace teraio::runtime::testing
