// runtime/tensor_memory: the live tensor memory that the executor moves, as its owner holds
// it. The torch binding implements it over PyTorch storages (swapping their data pointers);
// tests implement it over plain buffers. Every call comes from the thread that runs operators.
#pragma once

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
  // Hands memory the allocator caches but nobody uses back to the device, so that a large
  // block can be made of it (the executor calls it before retrying a refused reallocate).
  virtual void trim() {}
  // The executor's call (before_op, after_op, fetch, fetch_all, drain) is over, also when it threw.
  // Memory release() kept for a fetch of the same size later in the same call must go back
  // now: between calls the operators allocate, and the executor counts it as free.
  virtual void end_call() {}
  // Drops the tensor's memory once `copied_out` (the device side of its copy out) completes.
  // On CUDA the compute stream waits for the copy on the device and the block goes back to
  // the allocator at once, so the host does not drain the GPU's queue; the default waits on
  // the host.
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
};

}  // namespace teraio::runtime
