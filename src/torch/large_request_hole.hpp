// torch/large_request_hole: a device block the session holds for the operators' largest
// requests. At the device's limit the caching allocator's cache is full of freed blocks, and a
// request of 1-2 GiB seldom finds a free run that long: the allocator then unmaps its whole
// cache and maps it again (a flush). On W3 every flush was such a request, most of them
// 2 004 MiB, the size of a vocabulary-sized weight (bench/RESULTS.md, session 24). The session
// holds one block of the configured size, counted in the budget, gives it back to the allocator
// just before an operator that created a storage of more than half that size in the previous
// step, and takes it again once the storages that operator created are freed or moved out.
// Between steps it is given back: the budget's bytes are then the program's.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::torch_binding {

class LargeRequestHole {
 public:
  struct Counts {
    std::uint64_t opened = 0;        // blocks handed to an operator's request
    std::uint64_t taken = 0;         // blocks taken (again)
    std::uint64_t take_flushes = 0;  // allocator flushes while taking one (CUDA)
  };

  LargeRequestHole(c10::Device device, std::uint64_t bytes);
  std::uint64_t bytes() const { return bytes_; }
  bool held() const { return static_cast<bool>(block_); }
  // Whether an operator that created `largest_birth` bytes in one storage last step gets it.
  // One that would not fit in it could not use it, and its output would keep it from being taken.
  bool serves(std::uint64_t largest_birth) const {
    return largest_birth * 2 > bytes_ && largest_birth <= bytes_;
  }
  // Takes the block when it is not held and every storage the last opening served is gone
  // (`gone(id)`); allocator errors propagate.
  void take_if_free(const std::function<bool(trace::TensorId)>& gone);
  // Hands the block to the caching allocator for operator `op`, which is about to run.
  void open_for(trace::OpIndex op);
  // A storage operator `op` created: it is the opening's tenant when the block was opened for
  // `op` and the storage is large enough to have been served by it.
  void note_birth(trace::OpIndex op, trace::TensorId id, std::uint64_t bytes);
  // Gives the block back outside planned steps (the session stops carrying a plan, or closes).
  void release();
  Counts take_counts();

 private:
  c10::Device device_;
  std::uint64_t bytes_;
  c10::DataPtr block_;
  bool opened_ = false;
  trace::OpIndex opened_for_ = 0;
  std::vector<trace::TensorId> tenants_;
  Counts counts_;
};

}  // namespace teraio::torch_binding
