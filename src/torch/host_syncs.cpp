#include "host_syncs.hpp"

#include <cstring>

namespace teraio::torch_binding {
namespace {

bool on(const c10::IValue& value, const c10::Device& device) {
  if (!value.isTensor()) return false;
  const at::Tensor& t = value.toTensor();
  if (!t.defined()) return false;
  const c10::Device where = t.device();
  return where.type() == device.type() && (!device.has_index() || where.index() == device.index());
}

bool on_cpu(const c10::IValue& value) {
  return value.isTensor() && value.toTensor().defined() && value.toTensor().is_cpu();
}

}  // namespace

std::string_view host_sync(const at::RecordFunction& fn, const c10::Device& device) {
  const char* name = fn.name();
  // Most operators end here: every name checked starts with "aten::" and then one of three letters.
  if (name == nullptr || std::strncmp(name, "aten::", 6) != 0) return {};
  const char first = name[6];
  if (first != '_' && first != 'n' && first != 'c') return {};
  const auto inputs = fn.inputs();
  if (inputs.empty()) return {};
  if (std::strcmp(name, "aten::_local_scalar_dense") == 0) {
    return on(inputs[0], device) ? "a read of a device scalar (aten::_local_scalar_dense)"
                                 : std::string_view{};
  }
  if (std::strcmp(name, "aten::nonzero") == 0) {
    return on(inputs[0], device) ? "aten::nonzero" : std::string_view{};
  }
  if (std::strcmp(name, "aten::copy_") == 0 && inputs.size() >= 2) {
    // copy_(self, src, non_blocking): across the device and the CPU, blocking.
    const bool across =
        (on(inputs[0], device) && on_cpu(inputs[1])) || (on_cpu(inputs[0]) && on(inputs[1], device));
    const bool blocking = inputs.size() < 3 || !inputs[2].isBool() || !inputs[2].toBool();
    if (across && blocking && !device.is_cpu())
      return "a blocking copy between the device and the host (aten::copy_)";
  }
  return {};
}

}  // namespace teraio::torch_binding
