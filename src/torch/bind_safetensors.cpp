#include "bindings.hpp"

namespace teraio::torch_binding {
void bind_safetensors(py::module_&) {}
}  // namespace teraio::torch_binding
