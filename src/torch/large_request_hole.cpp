#include "large_request_hole.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "allocator_flushes.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace teraio::torch_binding {
namespace {

// The allocator operators on `device` allocate from: CUDA's caching allocator on the device.
c10::Allocator* allocator_of(c10::Device device) {
#ifdef TERAIO_TORCH_CUDA
  if (device.is_cuda()) return c10::cuda::CUDACachingAllocator::get();
#endif
  return c10::GetAllocator(device.type());
}

}  // namespace

LargeRequestHole::LargeRequestHole(c10::Device device, std::uint64_t bytes)
    : device_(device), bytes_(bytes) {}

void LargeRequestHole::take_if_free(const std::function<bool(trace::TensorId)>& gone) {
  if (held()) return;
  if (!std::all_of(tenants_.begin(), tenants_.end(), gone)) return;
  const std::int64_t before = allocator_flushes_so_far(device_);
  {
#ifdef TERAIO_TORCH_CUDA
    // On the device's current stream, the one the operators allocate on: the block serves
    // their requests.
    std::optional<c10::cuda::CUDAGuard> guard;
    if (device_.is_cuda()) guard.emplace(device_);
#endif
    block_ = allocator_of(device_)->allocate(bytes_);
  }
  counts_.take_flushes +=
      static_cast<std::uint64_t>(std::max<std::int64_t>(0, allocator_flushes_so_far(device_) - before));
  ++counts_.taken;
  opened_ = false;
  tenants_.clear();
}

void LargeRequestHole::open_for(trace::OpIndex op) {
  if (!held()) return;
  // Nothing ran on the block: it is free for the next request at once, on any stream's order.
  block_.clear();
  opened_ = true;
  opened_for_ = op;
  tenants_.clear();
  ++counts_.opened;
}

void LargeRequestHole::note_birth(trace::OpIndex op, trace::TensorId id, std::uint64_t bytes) {
  if (opened_ && op == opened_for_ && serves(bytes)) tenants_.push_back(id);
}

void LargeRequestHole::release() {
  block_.clear();
  opened_ = false;
  tenants_.clear();
}

LargeRequestHole::Counts LargeRequestHole::take_counts() {
  return std::exchange(counts_, Counts{});
}

}  // namespace teraio::torch_binding
