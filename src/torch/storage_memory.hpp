// torch/storage_memory: the executor's TensorMemory over PyTorch storages. Moving a storage
// out replaces its data pointer with an empty one (every tensor and view of it stays valid as
// an object; the observer fetches the bytes back before any operator touches them) and gives
// the memory back to PyTorch's allocator only after the copy out has completed; moving it in
// allocates through the storage's own allocator (CUDA: the caching allocator, on the compute
// stream) and installs the new pointer. Where the executor hands a wait to the device, the
// compute stream waits for the copy's event before the block is reused or the tensor is read. A storage with
// a transfer in flight is held by a strong reference, so the program cannot free memory a copy is still
// reading or writing.
#pragma once

#include <c10/core/Device.h>

#include <unordered_map>

#include "device_wait_clock.hpp"
#include "storage_table.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/runtime/executor.hpp"

namespace teraio::torch_binding {

class StorageMemory final : public runtime::TensorMemory {
 public:
  StorageMemory(StorageTable& table, io::DeviceCopier& copier, c10::Device device);

  bool alive(TensorId id) override { return table_.alive(id); }
  void* data(TensorId id) override;
  void before_copy_out(TensorId id) override;
  void release(TensorId id) override;
  void* reallocate(TensorId id) override;
  void trim() override;
  // The compute stream waits for the copy on the device (timed by the wait clock).
  void release_after(TensorId id, io::CopyEvent& copied_out) override;
  void use_after(TensorId id, io::CopyEvent& copied_in) override;
  // Seconds the compute stream waited for copies since the last call (once per step).
  double collect_device_stall() { return clock_->collect(); }

  // Drops the strong references of storages whose transfers have settled.
  void unpin_settled(const runtime::Executor& executor);
  // A storage whose fetch failed gets zeroed scratch memory of its size, so that the operator
  // about to run cannot dereference an empty pointer; its bytes stay valid in the tier.
  void give_scratch(c10::StorageImpl* impl);

 private:
  c10::StorageImpl* storage(TensorId id) const;
  void pin(TensorId id, c10::StorageImpl* impl);

  StorageTable& table_;
  io::DeviceCopier& copier_;
  c10::Device device_;
  std::unique_ptr<DeviceWaitClock> clock_;
  std::unordered_map<TensorId, c10::intrusive_ptr<c10::StorageImpl>> pinned_;
};

}  // namespace teraio::torch_binding
