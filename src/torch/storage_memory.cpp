#include "storage_memory.hpp"

#include <cstring>

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

}  // namespace

StorageMemory::StorageMemory(StorageTable& table, io::DeviceCopier& copier, c10::Device device)
    : table_(table), copier_(copier), device_(device), clock_(make_device_wait_clock(device)) {}

c10::StorageImpl* StorageMemory::storage(TensorId id) const {
  // A freed storage must never be touched again: reviving it would free it twice.
  c10::StorageImpl* impl = table_.find_id(id);
  if (impl == nullptr || !table_.alive(id)) {
    throw Error(ErrorKind::kInternal, cat("tensor ", id, " was freed but is still known to the executor"));
  }
  return impl;
}

void StorageMemory::pin(TensorId id, c10::StorageImpl* impl) {
  if (pinned_.count(id) != 0) return;
  TrackedStorage* entry = table_.find(impl);
  auto strong = entry != nullptr ? entry->weak.lock() : c10::intrusive_ptr<c10::StorageImpl>();
  if (!strong) throw Error(ErrorKind::kInternal, cat("tensor ", id, " was freed while being moved"));
  pinned_.emplace(id, std::move(strong));
}

void* StorageMemory::data(TensorId id) {
  return storage(id)->data_ptr().get();
}

void StorageMemory::before_copy_out(TensorId id) {
  pin(id, storage(id));
#ifdef TERAIO_TORCH_CUDA
  if (device_.is_cuda())
    copier_.wait_for_stream(c10::cuda::getCurrentCUDAStream(device_.index()).stream(),
                            io::CopyDirection::kToHost);
#endif
}

void StorageMemory::release(TensorId id) {
  c10::StorageImpl* impl = storage(id);
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  pinned_.erase(id);
}

void StorageMemory::release_after(TensorId id, io::CopyEvent& copied_out) {
  // The wait is queued before the block goes back: the allocator hands it out again only to
  // work queued after the wait on the compute stream.
  clock_->block(copied_out);
  release(id);
}

void StorageMemory::use_after(TensorId id, io::CopyEvent& copied_in) {
  static_cast<void>(id);
  clock_->block(copied_in);
}

void* StorageMemory::reallocate(TensorId id) {
  c10::StorageImpl* impl = storage(id);
  pin(id, impl);
  try {
    impl->set_data_ptr_noswap(allocate_on(impl, device_));
  } catch (const c10::OutOfMemoryError& error) {
    // Said in TeraIO's terms so that the executor can make room and retry.
    throw Error(ErrorKind::kOutOfMemory, cat("cannot allocate ", impl->nbytes(), " bytes on ", device_.str(),
                                             " for tensor ", id, ": ", error.what_without_backtrace()));
  }
#ifdef TERAIO_TORCH_CUDA
  // The caching allocator hands out blocks whose last users may still be queued on the
  // compute stream; the copy in runs on the engine's stream, so it must wait for them.
  if (device_.is_cuda())
    copier_.wait_for_stream(c10::cuda::getCurrentCUDAStream(device_.index()).stream(),
                            io::CopyDirection::kToDevice);
#endif
  return impl->data_ptr().get();
}

void StorageMemory::trim() {
#ifdef TERAIO_TORCH_CUDA
  // Blocks freed behind device-side waits are only reused in stream order; returning the
  // cached ones lets the allocator map one large block again (expandable segments or not).
  if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

void StorageMemory::unpin_settled(const runtime::Executor& executor) {
  for (auto it = pinned_.begin(); it != pinned_.end();) {
    const bool settled =
        !executor.contains(it->first) || (executor.location(it->first) != runtime::Location::kOffloading &&
                                          executor.location(it->first) != runtime::Location::kFetching);
    it = settled ? pinned_.erase(it) : std::next(it);
  }
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
