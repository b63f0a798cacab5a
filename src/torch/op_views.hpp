// torch/op_views: operators that only make views. A view shares its input's storage and
// neither reads nor writes the bytes, so it needs no storage resident and is no use of one:
// the session lets such an operator pass without counting it. On a transformer step a third
// of the top-level operators are views (transposes of weights, slices, unsqueezes); counting
// them cost host time in every step and cut idle intervals the planner could have used.
#pragma once

#include <ATen/record_function.h>

namespace teraio::torch_binding {

// True for the view operators named in op_views.cpp. `reshape`, `flatten`, `contiguous` and
// the like are not among them: they copy when the input's strides do not allow a view. False
// for `narrow` with a tensor start, and while Python runs inside operators (a dispatch mode,
// or a subclass with __torch_dispatch__ as the input).
bool only_makes_views(const at::RecordFunction& fn);

}  // namespace teraio::torch_binding
