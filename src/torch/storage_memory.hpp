// torch/storage_memory: the executor's TensorMemory over PyTorch storages. Moving a storage
// out replaces its data pointer with an empty one (every tensor and view of it stays valid as
// an object; the observer fetches the bytes back before any operator touches them) and gives
// the memory back to PyTorch's allocator only after the copy out has completed (or keeps it
// for a later fetch of its size, with reuse_blocks, as long as the executor says); moving it in
// allocates through the storage's own allocator (CUDA: the caching allocator, on the compute
// stream) and installs the new pointer. Where the executor hands a wait to the device, the
// compute stream waits for the copy's event before the block is reused or the tensor is read.
//
// While a transfer is in flight the memory belongs to the transfer, not to the storage: the
// storage points at it through a non-owning alias, and this class holds the owning pointer
// until the transfer settles. So the program can free the storage mid-copy without freeing
// memory a copy still reads or writes, and TeraIO never holds a strong reference to a storage.
// A strong reference would change what PyTorch does: the autograd engine accumulates a
// gradient in place only when it holds the storage's last reference, so a reference held by a
// transfer turns an aten::add_ into an aten::add, and the step no longer matches its profile.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "callback_parts.hpp"
#include "device_wait_clock.hpp"
#include "storage_table.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/runtime/executor.hpp"

namespace teraio::torch_binding {

class StorageMemory final : public runtime::TensorMemory {
 public:
  // `parts` times the allocations and hand-backs, for the step record. `reuse_blocks`: see
  // SessionConfig::reuse_blocks.
  StorageMemory(StorageTable& table, io::DeviceCopier& copier, c10::Device device, CallbackParts& parts,
                bool reuse_blocks = false);
  ~StorageMemory() override;
  StorageMemory(const StorageMemory&) = delete;
  StorageMemory& operator=(const StorageMemory&) = delete;

  bool alive(TensorId id) override { return table_.alive(id); }
  void* data(TensorId id) override;
  void before_copy_out(TensorId id) override;
  void release(TensorId id) override;
  void* reallocate(TensorId id) override;
  void trim() override;
  std::uint64_t spare_bytes() const override { return spare_bytes_; }
  bool has_spare(std::uint64_t bytes) const override { return find_spare(bytes) != spare_.end(); }
  std::uint64_t give_back_spares(std::uint64_t bytes, std::uint64_t for_fetch) override;
  // The compute stream waits for the copy on the device (timed by the wait clock).
  void release_after(TensorId id, io::CopyEvent& copied_out) override;
  void use_after(TensorId id, io::CopyEvent& copied_in) override;
  std::uint64_t cancel_copy_out(TensorId id, io::CopyEvent& copying_out) override;
  // The operator whose callbacks run now: the device waits queued from here on are its own.
  void at_op(std::uint32_t op) { op_ = op; }
  // Seconds the compute stream waited for copies since the last call (once per step), and
  // each wait that held it where `waits` is given.
  double collect_device_stall(std::vector<DeviceWait>* waits = nullptr) { return clock_->collect(waits); }
  // Fetches given a spare block (reuse_blocks), since the last call.
  std::uint64_t collect_blocks_reused() { return std::exchange(blocks_reused_, 0); }
  // The caching allocator's flushes (retries after freeing its whole cache) that happened inside
  // a fetch's allocation, and those allocations' time, since the last call. On W3 each flush
  // synchronizes and unmaps every free page; these say how many a TeraIO fetch brought on rather
  // than an operator's own allocation (CUDA; none elsewhere).
  struct FetchFlushes {
    std::uint64_t count = 0;
    std::uint64_t ns = 0;
  };
  FetchFlushes collect_fetch_flushes() { return std::exchange(fetch_flushes_, {}); }

  // Gives the memory of settled transfers back to their storages (or back to the allocator,
  // where the program freed the storage meanwhile).
  void hand_back_settled(const runtime::Executor& executor);
  // A storage whose fetch failed gets zeroed scratch memory of its size, so that the operator
  // about to run cannot dereference an empty pointer; its bytes stay valid in the tier.
  void give_scratch(c10::StorageImpl* impl);

 private:
  // A strong reference for the length of one call; throws once the storage is freed.
  c10::intrusive_ptr<c10::StorageImpl> live(TensorId id) const;
  // Takes the storage's memory into held_ and leaves an alias to it in the storage.
  void hold(TensorId id);
  // The memory held for `id` goes back to its storage if the storage is alive, else is freed.
  void hand_back(TensorId id);

  StorageTable& table_;
  io::DeviceCopier& copier_;
  c10::Device device_;
  CallbackParts& parts_;
  std::unique_ptr<DeviceWaitClock> clock_;
  std::uint32_t op_ = 0;  // at_op
  // Owning pointers of the memory of transfers in flight, by tensor.
  std::unordered_map<TensorId, c10::DataPtr> held_;
  // hand_back_settled() runs several times per operator: it looks through held_ only when
  // memory was taken since it last did, or a transfer settled (Executor::settled_changes).
  bool held_changed_ = true;
  std::uint64_t changes_seen_ = ~std::uint64_t{0};
  // Blocks of tensors moved out, by size, kept for a later fetch of the same size
  // (reuse_blocks): it gets one without the caching allocator freeing a block and finding
  // another. The executor counts them against the budget and says when they go back.
  // A block is ordered after its copy out through the stream current when it was released
  // (release_after), and a fetch into it waits for the stream current then (reallocate): it is
  // reused only by a fetch on the stream it was released on.
  struct SpareBlock {
    c10::DataPtr block;
    c10::StreamId stream;
  };
  c10::StreamId current_stream() const;
  // A spare block of `bytes` for a fetch on the current stream, or spare_.end().
  std::multimap<std::uint64_t, SpareBlock>::const_iterator find_spare(std::uint64_t bytes) const;
  bool reuse_blocks_;
  std::multimap<std::uint64_t, SpareBlock> spare_;
  std::uint64_t spare_bytes_ = 0;
  std::uint64_t blocks_reused_ = 0;
  FetchFlushes fetch_flushes_;
};

}  // namespace teraio::torch_binding
