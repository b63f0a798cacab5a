#include "storage_memory.hpp"

#include "paged_allocator.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "allocator_flushes.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace teraio::torch_binding {
namespace {

// Allocations go to the storage's device: the caching allocator allocates on the current one.
c10::DataPtr allocate_on(c10::StorageImpl* impl, c10::Device device) {
#ifdef TERAIO_TORCH_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device);
    return impl->allocator()->allocate(impl->nbytes());
  }
#endif
  static_cast<void>(device);
  return impl->allocator()->allocate(impl->nbytes());
}

// Adds the allocator's flushes during its life, and that life's nanoseconds where there were
// any, to `into`; also when the allocation throws, since a refused allocation flushed first.
class FlushWatch {
 public:
  FlushWatch(c10::Device device, StorageMemory::FetchFlushes& into)
      : device_(device),
        into_(into),
        watching_(device.is_cuda()),
        before_(watching_ ? allocator_flushes_so_far(device) : 0),
        start_(std::chrono::steady_clock::now()) {}
  ~FlushWatch() {
    if (!watching_) return;
    try {
      const std::int64_t flushed = allocator_flushes_so_far(device_) - before_;
      if (flushed <= 0) return;
      into_.count += static_cast<std::uint64_t>(flushed);
      into_.ns += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_)
              .count());
    } catch (...) {  // a statistic is not worth a throwing destructor
    }
  }
  FlushWatch(const FlushWatch&) = delete;
  FlushWatch& operator=(const FlushWatch&) = delete;

 private:
  c10::Device device_;
  StorageMemory::FetchFlushes& into_;
  bool watching_;
  std::int64_t before_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

StorageMemory::StorageMemory(StorageTable& table, io::DeviceCopier& copier, c10::Device device,
                             CallbackParts& parts, bool reuse_blocks)
    : table_(table),
      copier_(copier),
      device_(device),
      parts_(parts),
      clock_(make_device_wait_clock(device)),
      reuse_blocks_(reuse_blocks) {}

c10::intrusive_ptr<c10::StorageImpl> StorageMemory::live(TensorId id) const {
  // A freed storage must never be touched again: reviving it would free it twice.
  // A strong reference for the length of one call: another thread may drop the program's
  // last one meanwhile (the autograd engine runs operators on its own threads).
  c10::intrusive_ptr<c10::StorageImpl> impl = table_.lock(id);
  if (!impl)
    throw Error(ErrorKind::kInternal, cat("tensor ", id, " was freed but is still known to the executor"));
  return impl;
}

StorageMemory::~StorageMemory() {
  // After the executor (declared after this) has drained: a session that could not bring
  // everything back must not free memory that storages the program holds still point at.
  std::vector<TensorId> ids;
  for (const auto& [id, owning] : held_) ids.push_back(id);
  for (const TensorId id : ids) hand_back(id);
}

void StorageMemory::hold(TensorId id) {
  const c10::intrusive_ptr<c10::StorageImpl> impl = live(id);
  if (const auto found = held_.find(id); found != held_.end()) {
    if (impl->data_ptr().get() == found->second.get()) return;
    // Memory of an earlier storage under this id, which the program freed: its transfers
    // were awaited when the executor forgot it.
    held_.erase(found);
  }
  c10::DataPtr& slot = held_[id];
  held_changed_ = true;
  // Taken out first: on PyTorch 2 that materializes a copy-on-write buffer, so the alias
  // points at memory this storage alone owns.
  slot = impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
  impl->set_data_ptr_noswap(c10::DataPtr(slot.get(), impl->device()));
}

void StorageMemory::hand_back(TensorId id) {
  const auto found = held_.find(id);
  if (found == held_.end()) return;
  c10::DataPtr owning = std::move(found->second);
  held_.erase(found);
  const c10::intrusive_ptr<c10::StorageImpl> impl = table_.lock(id);
  if (!impl) return;  // freed meanwhile: the memory goes back to the allocator with `owning`
  // A storage that no longer points at it (a new storage under the same id) keeps its own.
  if (impl->data_ptr().get() == owning.get()) impl->set_data_ptr_noswap(std::move(owning));
}

void* StorageMemory::data(TensorId id) {
  return live(id)->data_ptr().get();
}

void StorageMemory::before_copy_out(TensorId id) {
  hold(id);
#ifdef TERAIO_TORCH_CUDA
  if (device_.is_cuda())
    copier_.wait_for_stream(c10::cuda::getCurrentCUDAStream(device_.index()).stream(),
                            io::CopyDirection::kToHost);
#endif
}

void StorageMemory::release(TensorId id) {
  const c10::intrusive_ptr<c10::StorageImpl> impl = table_.lock(id);
  if (impl) impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  const auto found = held_.find(id);
  if (found == held_.end()) return;  // the storage owned it (dropped without a copy out): freed
  c10::DataPtr owning = std::move(found->second);
  held_.erase(found);
  // A block held for its copy out is kept for a later fetch of its size. It is reused in the
  // order the allocator would hand it to compute-stream work: after the executor queued the
  // compute stream's wait for the copy out (release_after), and a fetch into it waits for the
  // compute stream. Unlike the allocator it does not wait for side streams a block was
  // recorded on (record_stream); the copy out does not either.
  if (reuse_blocks_ && impl && owning.get() != nullptr) {
    spare_bytes_ += impl->nbytes();
    spare_.emplace(impl->nbytes(), SpareBlock{std::move(owning), current_stream()});
  }
}

void StorageMemory::release_after(TensorId id, io::CopyEvent& copied_out) {
  // The wait is queued before the block goes back: the allocator hands it out again only to
  // work queued after the wait on the compute stream.
  clock_->block(copied_out, op_, DeviceWaitKind::kCopyOut, id);
  release(id);
}

void StorageMemory::use_after(TensorId id, io::CopyEvent& copied_in) {
  // Handed back after the wait is queued, for the same reason as in release_after.
  clock_->block(copied_in, op_, DeviceWaitKind::kCopyIn, id);
  hand_back(id);
}

std::uint64_t StorageMemory::cancel_copy_out(TensorId id, io::CopyEvent& copying_out) {
  // Handed back after the wait is queued: the program may free the storage at once, and the
  // allocator then reuses or unmaps the block in compute-stream order, after the bytes the
  // copy has started (a copy issued later from an unmapped block failed on the H100).
  const std::size_t dropped = clock_->block_started(copying_out, op_, id);
  hand_back(id);
  return dropped;
}

void* StorageMemory::reallocate(TensorId id) {
  const c10::intrusive_ptr<c10::StorageImpl> impl = live(id);
  c10::DataPtr fresh;
  if (const auto spare = find_spare(impl->nbytes()); spare != spare_.end()) {
    fresh = std::move(spare_.extract(spare).mapped().block);
    spare_bytes_ -= impl->nbytes();
    ++blocks_reused_;
  } else {
    try {
      const TimedNs timed(parts_.ns(CallbackPart::kAllocate));
      const FlushWatch watch(device_, fetch_flushes_);
      fresh = allocate_on(impl.get(), device_);
    } catch (const c10::OutOfMemoryError& error) {
      // Said in TeraIO's terms so that the executor can make room and retry.
      throw Error(ErrorKind::kOutOfMemory,
                  cat("cannot allocate ", impl->nbytes(), " bytes on ", device_.str(), " for tensor ", id,
                      ": ", error.what_without_backtrace()));
    }
  }
  void* start = fresh.get();
  held_.insert_or_assign(id, std::move(fresh));
  held_changed_ = true;
  impl->set_data_ptr_noswap(c10::DataPtr(start, impl->device()));
#ifdef TERAIO_TORCH_CUDA
  // The caching allocator hands out blocks whose last users may still be queued on the
  // compute stream; the copy in runs on the engine's stream, so it must wait for them.
  if (device_.is_cuda())
    copier_.wait_for_stream(c10::cuda::getCurrentCUDAStream(device_.index()).stream(),
                            io::CopyDirection::kToDevice);
#endif
  return start;
}

c10::StreamId StorageMemory::current_stream() const {
#ifdef TERAIO_TORCH_CUDA
  if (device_.is_cuda()) return c10::cuda::getCurrentCUDAStream(device_.index()).id();
#endif
  return 0;
}

std::multimap<std::uint64_t, StorageMemory::SpareBlock>::const_iterator StorageMemory::find_spare(
    std::uint64_t bytes) const {
  if (spare_.empty()) return spare_.end();  // reuse_blocks off: asked at every eviction, so kept cheap
  const c10::StreamId stream = current_stream();
  const auto [first, end] = spare_.equal_range(bytes);
  const auto found =
      std::find_if(first, end, [&](const auto& block) { return block.second.stream == stream; });
  return found == end ? spare_.end() : found;
}

std::uint64_t StorageMemory::give_back_spares(std::uint64_t bytes, std::uint64_t for_fetch) {
  // Largest first: the fewest blocks go back for the bytes asked.
  const auto spared = for_fetch != 0 ? find_spare(for_fetch) : spare_.cend();
  std::uint64_t given = 0;
  for (auto block = spare_.end(); block != spare_.begin() && given < bytes;) {
    --block;
    if (block == spared) continue;
    given += block->first;
    spare_bytes_ -= block->first;
    block = spare_.erase(block);
  }
  return given;
}

void StorageMemory::trim() {
  spare_.clear();
  spare_bytes_ = 0;
#ifdef TERAIO_TORCH_CUDA
  // Blocks freed behind device-side waits are only reused in stream order; returning the
  // cached ones lets the allocator map one large block again (expandable segments or not).
  // The paged allocator already serves a request from any freed block's pages: emptying it
  // would only wait for the device.
  if (device_.is_cuda() && !paged_allocator_installed()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

void StorageMemory::hand_back_settled(const runtime::Executor& executor) {
  // Read before looking: a transfer settling meanwhile changes the count again.
  const std::uint64_t changes = executor.settled_changes();
  if (!held_changed_ && changes == changes_seen_) return;
  const TimedNs timed(parts_.ns(CallbackPart::kHandBack));
  changes_seen_ = changes;
  held_changed_ = false;
  std::vector<TensorId> settled;
  for (const auto& [id, owning] : held_) {
    if (!executor.in_flight(id)) settled.push_back(id);
  }
  for (const TensorId id : settled) hand_back(id);
}

void StorageMemory::give_scratch(c10::StorageImpl* impl) {
  if (impl->data_ptr().get() != nullptr || impl->nbytes() == 0) return;
  impl->set_data_ptr_noswap(allocate_on(impl, device_));
#ifdef TERAIO_TORCH_CUDA
  if (device_.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device_);
    C10_CUDA_CHECK(cudaMemsetAsync(impl->data_ptr().get(), 0, impl->nbytes(),
                                   c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
    return;
  }
#endif
  std::memset(impl->data_ptr().get(), 0, impl->nbytes());
}

}  // namespace teraio::torch_binding
