// torch/bindings: the parts of the teraio._native Python module, one function per area.
#pragma once

#include <torch/extension.h>

namespace teraio::torch_binding {

namespace py = pybind11;

// Error translation, sizes, version and build facts.
void bind_core(py::module_& m);
// teraio.Session's native half (profiler, planner, executor over PyTorch storages).
void bind_session(py::module_& m);
// teraio.safetensors' native half (loader and writer into and out of torch tensors).
void bind_safetensors(py::module_& m);

}  // namespace teraio::torch_binding
