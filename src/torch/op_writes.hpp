// torch/op_writes: which of an operator's arguments it may change, read from its schema's
// alias annotations (`Tensor(a!)`). A copy of a tensor kept off the device stays valid only
// while the operators that use it just read it, so every write must be seen.
#pragma once

#include <ATen/record_function.h>

#include <vector>

namespace teraio::torch_binding {

// For each of the operator's inputs (fn.inputs(), in order): true where the operator may write
// the tensors that input holds. Without a schema that matches the inputs (not a dispatcher
// operator), every input counts as written, and so does every input of the few operators whose
// schemas leave writes out (batch and instance norm's running statistics, c10d collectives).
// Cached per thread by operator name, overload and input count.
const std::vector<bool>& written_inputs(const at::RecordFunction& fn);

}  // namespace teraio::torch_binding
