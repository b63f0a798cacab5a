#include "op_views.hpp"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string_view>
#include <unordered_set>

namespace teraio::torch_binding {

bool only_makes_views(const at::RecordFunction& fn) {
  // By name, not by alias annotation: `reshape(Tensor(a) self)` is annotated as a view but
  // copies when it must, and the copy would read a storage that was never fetched. Every
  // overload of these names returns views of its input (or a list of them), but one below.
  static const std::unordered_set<std::string_view> kViews{
      "aten::alias",     "aten::as_strided", "aten::chunk",     "aten::detach",           "aten::diagonal",
      "aten::expand",    "aten::expand_as",  "aten::movedim",   "aten::narrow",           "aten::permute",
      "aten::select",    "aten::slice",      "aten::split",     "aten::split_with_sizes", "aten::squeeze",
      "aten::swapaxes",  "aten::t",          "aten::transpose", "aten::unbind",           "aten::unfold",
      "aten::unsqueeze", "aten::view",       "aten::view_as",   "aten::_reshape_alias"};
  const char* name = fn.name();
  if (name == nullptr || !kViews.contains(name)) return false;
  // narrow.Tensor reads its start from a tensor (an item() nested inside it).
  if (std::string_view(name) == "aten::narrow") {
    const auto op = fn.operator_name();
    if (!op || op->overload_name == "Tensor") return false;
  }
  // Under a Python dispatch mode, or on a tensor subclass with __torch_dispatch__, Python runs
  // inside the operator and may read the bytes (a NaN check): counted, as any operator.
  if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Python)) return false;
  const auto inputs = fn.inputs();
  return inputs.empty() || !inputs[0].isTensor() ||
         !inputs[0].toTensor().key_set().has(c10::DispatchKey::Python);
}

}  // namespace teraio::torch_binding
