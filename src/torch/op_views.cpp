#include "op_views.hpp"

#include <string_view>
#include <unordered_set>

namespace teraio::torch_binding {

bool only_makes_views(const at::RecordFunction& fn) {
  // By name, not by alias annotation: `reshape(Tensor(a) self)` is annotated as a view but
  // copies when it must, and the copy would read a storage that was never fetched. Every
  // overload of these names returns views of its input (or a list of them).
  static const std::unordered_set<std::string_view> kViews{
      "aten::alias",     "aten::as_strided", "aten::chunk",     "aten::detach",           "aten::diagonal",
      "aten::expand",    "aten::expand_as",  "aten::movedim",   "aten::narrow",           "aten::permute",
      "aten::select",    "aten::slice",      "aten::split",     "aten::split_with_sizes", "aten::squeeze",
      "aten::swapaxes",  "aten::t",          "aten::transpose", "aten::unbind",           "aten::unfold",
      "aten::unsqueeze", "aten::view",       "aten::view_as",   "aten::_reshape_alias"};
  const char* name = fn.name();
  return name != nullptr && kViews.contains(name);
}

}  // namespace teraio::torch_binding
