// torch/cuda_check: CUDA runtime failures of the binding's own calls (events, stream waits) as
// teraio::Error{kCuda}, the one error type the session's callbacks know how to report.
#pragma once

#ifdef TERAIO_TORCH_CUDA
#include <cuda_runtime_api.h>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::torch_binding {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  // Clears the runtime's last-error slot so that a later, unrelated check does not see it.
  cudaGetLastError();
  throw Error(ErrorKind::kCuda, cat(what, ": ", cudaGetErrorString(status)));
}

}  // namespace teraio::torch_binding
#endif
