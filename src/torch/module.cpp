#include "bindings.hpp"

PYBIND11_MODULE(_native, m) {
  m.doc() = "TeraIO native module: lifetime-aware tensor offloading and fast safetensors I/O";
  teraio::torch_binding::bind_core(m);
  teraio::torch_binding::bind_session(m);
  teraio::torch_binding::bind_safetensors(m);
}
