// Placeholder replaced by the CUDA copier implementation.
#include "teraio/core/error.hpp"
#include "teraio/io/device_copy.hpp"

namespace teraio::io {

bool cuda_compiled_in() {
  return true;
}

std::unique_ptr<DeviceCopier> make_cuda_copier(int) {
  throw Error(ErrorKind::kUnsupported, "CUDA copier not implemented yet");
}

}  // namespace teraio::io
