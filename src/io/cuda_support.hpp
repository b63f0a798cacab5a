// io/cuda_support: what the CUDA copier's parts share (device_copy_cuda.cpp, copy_lane_cuda.cpp):
// error checks in the engine's terms, driver functions looked up through the runtime, a pool of
// reusable events, a stream drained on destruction.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::io::cuda_detail {

inline void check(cudaError_t rc, const std::string& call) {
  if (rc == cudaSuccess) return;
  // Clears the runtime's last-error slot so that a later, unrelated check does not see it.
  cudaGetLastError();
  throw Error(ErrorKind::kCuda, cat(call, ": ", cudaGetErrorName(rc), ": ", cudaGetErrorString(rc)));
}

inline void warn_if_failed(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) log::warn(call, " failed during cleanup: ", cudaGetErrorString(rc));
}

// A CUDA driver function, looked up through the runtime (cudaGetDriverEntryPointByVersion), as
// TeraIO links only cudart; `abi` is the driver ABI version asked for. kUnsupported, naming
// `needed_by`, where the driver has none.
template <typename Function>
Function driver_entry_point(const char* name, unsigned int abi, const char* needed_by) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  check(cudaGetDriverEntryPointByVersion(name, &function, abi, cudaEnableDefault, &found),
        cat("cudaGetDriverEntryPointByVersion(", name, ")"));
  if (found != cudaDriverEntryPointSuccess || function == nullptr)
    throw Error(ErrorKind::kUnsupported,
                cat("the CUDA driver has no ", name, " (needed by ", needed_by, ")"));
  return reinterpret_cast<Function>(function);
}

// Events are created once and reused: cudaEventCreate costs microseconds, a copy may be tiny.
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) warn_if_failed(cudaEventDestroy(e), "cudaEventDestroy");
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  cudaEvent_t take() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard lock(mutex_);
    free_.push_back(e);
  }

 private:
  int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// A stream that is drained before it is destroyed, so that no copy outlives its copier.
class Stream {
 public:
  explicit Stream(int device) : device_(device) {
    check(cudaSetDevice(device), cat("cudaSetDevice(", device, ")"));
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~Stream() {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    warn_if_failed(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    warn_if_failed(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace teraio::io::cuda_detail
