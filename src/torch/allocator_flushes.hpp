// torch/allocator_flushes: how often the CUDA caching allocator has retried an allocation after
// freeing its whole cache (a flush), read around an allocation to count the flushes it caused.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "paged_allocator.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace teraio::torch_binding {

// 0 off CUDA, where no allocator flushes, and under the paged allocator, which never does.
inline std::int64_t allocator_flushes_so_far(c10::Device device) {
#ifdef TERAIO_TORCH_CUDA
  if (device.is_cuda() && !paged_allocator_installed()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).num_alloc_retries;
  }
#endif
  static_cast<void>(device);
  return 0;
}

}  // namespace teraio::torch_binding
