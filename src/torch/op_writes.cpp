#include "op_writes.hpp"

#include <ATen/core/alias_info.h>
#include <ATen/core/function_schema.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>

namespace teraio::torch_binding {
namespace {

bool writes(const c10::AliasInfo* alias) {
  if (alias == nullptr) return false;
  if (alias->isWrite()) return true;
  // A list of written tensors (`Tensor(a!)[]`) carries the write on its element type.
  const auto& contained = alias->containedTypes();
  return std::any_of(contained.begin(), contained.end(), [](const c10::AliasInfo& a) { return writes(&a); });
}

// Operators whose schemas do not mark every argument they change: batch and instance norm
// update their running statistics in place, and c10d's collectives write their tensors.
bool unannotated_writer(std::string_view name) {
  return name.find("batch_norm") != std::string_view::npos ||
         name.find("instance_norm") != std::string_view::npos || name.rfind("c10d::", 0) == 0;
}

std::vector<bool> schema_mask(const at::RecordFunction& fn, std::size_t inputs) {
  const auto schema = fn.operator_schema();
  if (!schema || schema->arguments().size() != inputs || unannotated_writer(schema->name()))
    return std::vector<bool>(inputs, true);
  std::vector<bool> mask(inputs);
  for (std::size_t i = 0; i < inputs; ++i) mask[i] = writes(schema->arguments()[i].alias_info());
  return mask;
}

struct Key {
  std::string name;  // with the overload: overloads of one arity can write different arguments
  std::size_t inputs;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  std::size_t operator()(const Key& k) const {
    return std::hash<std::string>{}(k.name) ^ (k.inputs * 0x9e3779b9u);
  }
};

}  // namespace

const std::vector<bool>& written_inputs(const at::RecordFunction& fn) {
  // One schema copy per operator kind and thread instead of one per call.
  thread_local std::unordered_map<Key, std::vector<bool>, KeyHash> cache;
  const auto op = fn.operator_name();
  Key key{op ? op->name + "." + op->overload_name : std::string(fn.name() != nullptr ? fn.name() : ""),
          fn.inputs().size()};
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  std::vector<bool> mask = schema_mask(fn, key.inputs);
  return cache.emplace(std::move(key), std::move(mask)).first->second;
}

}  // namespace teraio::torch_binding
