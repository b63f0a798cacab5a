// runtime/tensor_memory: the live tensor memory that the executor moves, as its owner holds
// it. The torch binding implements it over PyTorch storages (swapping their data pointers);
// tests implement it over plain buffers. Every call comes from the thread that runs operators.
#pragma once

#include <cstdint>

#include "teraio/io/device_copy.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::runtime {

using trace::OpIndex;
using trace::TensorId;

class TensorMemory {
 public:
  virtual ~TensorMemory() = default;
  // False once the program has freed the tensor: the executor then forgets it instead of
  // moving it (its owner need not report every free at once).
  virtual bool alive(TensorId id) {
    static_cast<void>(id);
    return true;
  }
  // Start of the memory a tensor holds now (device memory; host memory in CPU training).
  virtual void* data(TensorId id) = 0;
  // Called just before a copy out of the tensor is submitted: on CUDA it orders the engine's
  // copies after the work already queued on the compute stream (which may still use it).
  virtual void before_copy_out(TensorId id) = 0;
  // Drops the tensor's memory: the copy out has completed and nothing may use it any more.
  virtual void release(TensorId id) = 0;
  // Gives the tensor a fresh allocation of its size and returns its start. The executor fills
  // it and waits for the fill before any operator uses the tensor. Throws
  // Error{kOutOfMemory} when the allocator has no block that large.
  virtual void* reallocate(TensorId id) = 0;
  // Hands memory the allocator caches but nobody uses back to the device, spare blocks too, so
  // that a large block can be made of it (the executor calls it before its last retry of a
  // refused reallocate).
  virtual void trim() {}
  // Device memory that release() kept as spare blocks for a later fetch of their size
  // (reuse_blocks). It counts against the budget as a resident tensor does: the executor gives
  // it back before it moves a tensor out, and keeps none outside a step, in passive mode or
  // without a budget.
  virtual std::uint64_t spare_bytes() const { return 0; }
  // Whether a fetch of `bytes` would get a spare block from reallocate().
  virtual bool has_spare(std::uint64_t bytes) const {
    static_cast<void>(bytes);
    return false;
  }
  // Gives spare blocks back to the allocator until `bytes` have gone or none is left but the one
  // a fetch of `for_fetch` bytes would take (0: no fetch). Returns the bytes given back.
  virtual std::uint64_t give_back_spares(std::uint64_t bytes, std::uint64_t for_fetch) {
    static_cast<void>(bytes);
    static_cast<void>(for_fetch);
    return 0;
  }
  // Drops the tensor's memory once `copied_out` (the device side of its copy out) completes.
  // On CUDA the compute stream waits for the copy on the device and the block goes back to
  // the allocator (or is kept as a spare block) at once, so the host does not drain the GPU's
  // queue; the default waits on the host.
  virtual void release_after(TensorId id, io::CopyEvent& copied_out) {
    copied_out.wait();
    release(id);
  }
  // Orders every later use of the tensor after `copied_in`, the copy that fills the memory
  // reallocate() gave it: on CUDA the compute stream waits on the device; the default waits
  // on the host.
  virtual void use_after(TensorId id, io::CopyEvent& copied_in) {
    static_cast<void>(id);
    copied_in.wait();
  }
  // The tensor stays where it is, but `copying_out` (the device side of its copy out) still
  // reads its memory: orders every later use of that memory, its free by the program
  // included, after the bytes the copy has started, and drops the rest (CopyEvent::abandon).
  // On CUDA the compute stream waits on the device; the default waits on the host. Returns the
  // bytes that will not be copied.
  virtual std::uint64_t cancel_copy_out(TensorId id, io::CopyEvent& copying_out) {
    static_cast<void>(id);
    copying_out.wait();
    return 0;
  }
};

}  // namespace teraio::runtime
