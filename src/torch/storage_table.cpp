#include "storage_table.hpp"

namespace teraio::torch_binding {

TensorId tensor_id_for(const FirstSight& sight) {
  // Fields packed without overlap for any realistic step (2^31 operators, 2^16 nested
  // operators, 2^15 slots), so ids never collide within a step.
  return (static_cast<TensorId>(sight.op) << 32) | (static_cast<TensorId>(sight.nested & 0xffffu) << 16) |
         (static_cast<TensorId>(sight.output ? 1u : 0u) << 15) | static_cast<TensorId>(sight.slot & 0x7fffu);
}

TrackedStorage* StorageTable::find(c10::StorageImpl* impl) {
  const auto it = by_impl_.find(impl);
  if (it == by_impl_.end()) return nullptr;
  return &it->second;
}

c10::StorageImpl* StorageTable::find_id(TensorId id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

TrackedStorage& StorageTable::add(const c10::Storage& storage, TensorId id, std::uint64_t step) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  by_id_[id] = impl;
  return by_impl_
      .insert_or_assign(impl, TrackedStorage(storage.getWeakStorageImpl(), id, storage.nbytes(), step))
      .first->second;
}

void StorageTable::erase(c10::StorageImpl* impl) {
  const auto it = by_impl_.find(impl);
  if (it == by_impl_.end()) return;
  const auto id_it = by_id_.find(it->second.id);
  if (id_it != by_id_.end() && id_it->second == impl) by_id_.erase(id_it);
  by_impl_.erase(it);
}

std::vector<TensorId> StorageTable::sweep_dead() {
  std::vector<TensorId> dead;
  for (auto it = by_impl_.begin(); it != by_impl_.end();) {
    if (it->second.weak.expired()) {
      dead.push_back(it->second.id);
      const auto id_it = by_id_.find(it->second.id);
      if (id_it != by_id_.end() && id_it->second == it->first) by_id_.erase(id_it);
      it = by_impl_.erase(it);
    } else {
      ++it;
    }
  }
  return dead;
}

c10::intrusive_ptr<c10::StorageImpl> StorageTable::lock(TensorId id) const {
  const auto it = by_id_.find(id);
  if (it == by_id_.end()) return {};
  return by_impl_.at(it->second).weak.lock();
}

bool StorageTable::alive(TensorId id) const {
  const auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  return !by_impl_.at(it->second).weak.expired();
}

void StorageTable::clear() {
  by_impl_.clear();
  by_id_.clear();
}

}  // namespace teraio::torch_binding
