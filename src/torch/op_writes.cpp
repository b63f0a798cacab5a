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

std::vector<bool> schema_mask(const at::RecordFunction& fn, std::size_t inputs) {
  const auto schema = fn.operator_schema();
  if (!schema || schema->arguments().size() != inputs) return std::vector<bool>(inputs, true);
  std::vector<bool> mask(inputs);
  for (std::size_t i = 0; i < inputs; ++i) mask[i] = writes(schema->arguments()[i].alias_info());
  return mask;
}

struct Key {
  std::string name;
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
  const char* name = fn.name();
  Key key{name != nullptr ? name : "", fn.inputs().size()};
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  std::vector<bool> mask = schema_mask(fn, key.inputs);
  return cache.emplace(std::move(key), std::move(mask)).first->second;
}

}  // namespace teraio::torch_binding
