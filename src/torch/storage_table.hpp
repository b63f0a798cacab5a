// torch/storage_table: identity of PyTorch storages across training steps. A storage is known
// by its StorageImpl (views share it, so storages are tracked and moved whole) and gets a
// TensorId the first time it is seen. The id is derived from where it was first seen — the
// operator's position in the step, the nesting of the operator that produced it and the slot —
// so that the storages a repeating step creates get the same ids in every step. Weak
// references detect storages the program has freed without keeping their memory alive.
#pragma once

#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::torch_binding {

using trace::OpIndex;
using trace::TensorId;

// Where a storage was first seen inside a step: the key its id derives from.
struct FirstSight {
  OpIndex op = 0;            // top-level operator of the step
  std::uint32_t nested = 0;  // 0: the operator itself; n: the n-th operator nested in it
  std::uint32_t slot = 0;    // input or output position (flattened through lists)
  bool output = false;
};

TensorId tensor_id_for(const FirstSight& sight);

struct TrackedStorage {
  TrackedStorage(c10::weak_intrusive_ptr<c10::StorageImpl> weak_ref, TensorId tensor, std::uint64_t size,
                 std::uint64_t step)
      : weak(std::move(weak_ref)), id(tensor), bytes(size), born_step(step) {}
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;
  TensorId id = 0;
  std::uint64_t bytes = 0;
  std::uint64_t born_step = 0;  // session step in which it was first seen
};

class StorageTable {
 public:
  // The storage's entry, or nullptr when it is not tracked (or its old entry died).
  TrackedStorage* find(c10::StorageImpl* impl);
  // The storage whose id this is, or nullptr.
  c10::StorageImpl* find_id(TensorId id) const;
  // Starts tracking; the id must be free (see holder_of).
  TrackedStorage& add(const c10::Storage& storage, TensorId id, std::uint64_t step);
  // The live storage that holds `id` now, if any.
  c10::StorageImpl* holder_of(TensorId id) const { return find_id(id); }
  void erase(c10::StorageImpl* impl);
  // Forgets every dead storage and returns their ids.
  std::vector<TensorId> sweep_dead();
  bool alive(TensorId id) const;
  // A strong reference to the storage under `id`, null once it is freed.
  c10::intrusive_ptr<c10::StorageImpl> lock(TensorId id) const;
  std::size_t size() const { return by_impl_.size(); }
  template <typename F>
  void for_each(F&& f) {
    for (auto& [impl, entry] : by_impl_) f(impl, entry);
  }
  void clear();

 private:
  std::unordered_map<c10::StorageImpl*, TrackedStorage> by_impl_;
  std::unordered_map<TensorId, c10::StorageImpl*> by_id_;
};

// Storages born in a profiled step, watched until the program frees them: a storage can stay
// allocated well after its last use (a Python variable reassigned only in the next loop
// iteration), and the plan must count those bytes. A weak reference per storage keeps the
// check per operator to one atomic load each.
class ReleaseWatch {
 public:
  void clear() { watched_.clear(); }
  void watch(TensorId id, c10::weak_intrusive_ptr<c10::StorageImpl> weak) {
    watched_.emplace_back(id, std::move(weak));
  }
  // Calls each(id) for every watched storage, freed or not, and stops watching them all.
  template <typename Each>
  void drain(const Each& each) {
    for (const auto& [id, weak] : watched_) each(id);
    watched_.clear();
  }
  // Calls freed(id) for every watched storage freed since the last sweep, and stops watching it.
  template <typename Freed>
  void sweep(const Freed& freed) {
    for (std::size_t i = 0; i < watched_.size();) {
      if (!watched_[i].second.expired()) {
        ++i;
        continue;
      }
      freed(watched_[i].first);
      watched_[i] = std::move(watched_.back());
      watched_.pop_back();
    }
  }

 private:
  std::vector<std::pair<TensorId, c10::weak_intrusive_ptr<c10::StorageImpl>>> watched_;
};

}  // namespace teraio::torch_binding
