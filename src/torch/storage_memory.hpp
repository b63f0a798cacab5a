// torch/storage_memory: the executor's TensorMemory over PyTorch storages. Moving a storage
// out replaces its data pointer with an empty one (every tensor and view of it stays valid as
// an object; the observer fetches the bytes back before any operator touches them) and gives
// the memory back to PyTorch's allocator only after the copy out has completed; moving it in
// allocates through the storage's own allocator (CUDA: the caching allocator, on the compute
// stream) and installs the new pointer. A storage with a transfer in flight is held by a
// strong reference, so the program cannot free memory a copy is still reading or writing.
#pragma once

#include <c10/core/Device.h>

#include <unordered_map>

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
  std::unordered_map<TensorId, c10::intrusive_ptr<c10::StorageImpl>> pinned_;
};

}  // namespace teraio::torch_binding
