#include "bindings.hpp"

namespace teraio::torch_binding {
void bind_session(py::module_&) {}
}  // namespace teraio::torch_binding
