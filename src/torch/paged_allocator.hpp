// torch/paged_allocator: TeraIO's paged device memory (io::PagedDeviceMemory) installed as
// PyTorch's CUDA allocator through CUDAPluggableAllocator, a stock PyTorch API. It must be
// installed before PyTorch's own allocator serves its first request in the process.
#pragma once

#include <optional>

#include "teraio/io/paged_device_memory.hpp"

namespace teraio::torch_binding {

// Throws Error(kUnsupported) off CUDA, kInvalidArgument once PyTorch's allocator has started.
// page_bytes 0: io::kDefaultPageBytes (8 MiB).
void install_paged_allocator(int device, std::uint64_t page_bytes);
bool paged_allocator_installed();
std::optional<io::PagedMemoryStats> paged_allocator_stats();
// The installed allocator's memory, for its recordings (io/paged_recording); Error(kInvalidArgument)
// when none is installed.
io::PagedDeviceMemory& installed_paged_memory();

// While it lives, the installed paged allocator holds `copier`'s copies back (those of both
// directions, or those to the host: `held`) for its driver calls
// (io::PagedDeviceMemory::hold_copies_with, DeviceCopier::hold_copies). Throws
// Error(kInvalidArgument) when no paged allocator is installed or the copier cannot hold its
// copies (issue order, or no CUDA device): no request would be held, and nothing says so.
class PagedCopyHolds {
 public:
  PagedCopyHolds(io::DeviceCopier& copier, io::HeldCopies held);
  ~PagedCopyHolds();
  PagedCopyHolds(const PagedCopyHolds&) = delete;
  PagedCopyHolds& operator=(const PagedCopyHolds&) = delete;

 private:
  io::PagedDeviceMemory& memory_;
};

}  // namespace teraio::torch_binding
