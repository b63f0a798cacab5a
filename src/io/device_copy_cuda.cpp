// The CUDA implementation of DeviceCopier: one non-blocking stream per direction, so that an
// offload (device -> host) never queues behind a prefetch (host -> device) and both use the
// two copy engines at once; one pooled event per copy marks its completion.
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/device_copy.hpp"

namespace teraio::io {
namespace {

void check(cudaError_t rc, const std::string& call) {
  if (rc == cudaSuccess) return;
  // Clears the runtime's last-error slot so that a later, unrelated check does not see it.
  cudaGetLastError();
  throw Error(ErrorKind::kCuda, cat(call, ": ", cudaGetErrorName(rc), ": ", cudaGetErrorString(rc)));
}

void warn_if_failed(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) log::warn(call, " failed during cleanup: ", cudaGetErrorString(rc));
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

class CudaCopyEvent final : public CopyEvent {
 public:
  CudaCopyEvent(std::shared_ptr<EventPool> pool, cudaEvent_t event, std::string what)
      : pool_(std::move(pool)), event_(event), what_(std::move(what)) {}
  ~CudaCopyEvent() override { pool_->give_back(event_); }
  CudaCopyEvent(const CudaCopyEvent&) = delete;
  CudaCopyEvent& operator=(const CudaCopyEvent&) = delete;

  bool ready() override {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    check(rc, cat("cudaEventQuery(", what_, ")"));
    return true;
  }
  void wait() override { check(cudaEventSynchronize(event_), cat("cudaEventSynchronize(", what_, ")")); }
  // The wait binds to the event's latest record, so the event may go back to the pool and be
  // recorded again by another copy without changing what this stream waits for.
  void block_stream(void* stream) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0),
          cat("cudaStreamWaitEvent(", what_, ")"));
  }

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t event_;
  std::string what_;
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

class CudaCopier final : public DeviceCopier {
 public:
  explicit CudaCopier(int device)
      : device_(device), events_(std::make_shared<EventPool>(device)), to_host_(device), to_device_(device) {}

  std::string name() const override { return cat("cuda:", device_); }
  bool is_cuda() const override { return true; }

  std::unique_ptr<CopyEvent> to_host(void* host_dst, const void* device_src, std::size_t n) override {
    return copy(host_dst, device_src, n, cudaMemcpyDeviceToHost, to_host_, to_host_mutex_, "device->host");
  }
  std::unique_ptr<CopyEvent> to_device(void* device_dst, const void* host_src, std::size_t n) override {
    return copy(device_dst, host_src, n, cudaMemcpyHostToDevice, to_device_, to_device_mutex_,
                "host->device");
  }

  void pin(void* host, std::size_t n) override {
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    check(cudaHostRegister(host, n, cudaHostRegisterDefault),
          cat("cudaHostRegister(", host, ", ", n, " bytes)"));
  }
  void unpin(void* host) override { check(cudaHostUnregister(host), cat("cudaHostUnregister(", host, ")")); }

  void* allocate_device(std::size_t n) override {
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    void* p = nullptr;
    check(cudaMalloc(&p, n == 0 ? 1 : n), cat("cudaMalloc(", format_bytes(n), " on ", name(), ")"));
    return p;
  }
  void wait_for_stream(void* compute_stream, CopyDirection direction) override {
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    auto* stream = static_cast<cudaStream_t>(compute_stream);
    const bool to_host = direction == CopyDirection::kToHost;
    cudaEvent_t event = events_->take();
    // The event is only a marker in the compute stream; giving it back right away is safe
    // because the wait below binds to this record before the event can be recorded again.
    try {
      check(cudaEventRecord(event, stream), "cudaEventRecord(compute stream)");
      std::lock_guard lock(to_host ? to_host_mutex_ : to_device_mutex_);
      check(
          cudaStreamWaitEvent((to_host ? to_host_ : to_device_).get(), event, 0),
          to_host ? "cudaStreamWaitEvent(device->host stream)" : "cudaStreamWaitEvent(host->device stream)");
    } catch (...) {
      events_->give_back(event);
      throw;
    }
    events_->give_back(event);
  }

  void free_device(void* device) override {
    if (device == nullptr) return;
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    check(cudaFree(device), cat("cudaFree(", device, ")"));
  }

 private:
  std::unique_ptr<CopyEvent> copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind,
                                  const Stream& stream, std::mutex& mutex, const char* direction) {
    const std::string what = cat(direction, " ", n, " bytes ", src, " -> ", dst, " on ", name());
    cudaEvent_t event = events_->take();
    auto completion = std::make_unique<CudaCopyEvent>(events_, event, what);
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    // The lock keeps each event right behind its own copy: without it another thread's copy
    // could slip in between and this event would also wait for that one.
    std::lock_guard lock(mutex);
    if (n > 0) check(cudaMemcpyAsync(dst, src, n, kind, stream.get()), cat("cudaMemcpyAsync(", what, ")"));
    check(cudaEventRecord(event, stream.get()), cat("cudaEventRecord(", what, ")"));
    return completion;
  }

  int device_;
  std::shared_ptr<EventPool> events_;
  Stream to_host_;
  Stream to_device_;
  std::mutex to_host_mutex_;
  std::mutex to_device_mutex_;
};

}  // namespace

bool cuda_compiled_in() {
  return true;
}

CudaInventory cuda_inventory() {
  CudaInventory inventory;
  int runtime = 0;
  int driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  const std::string versions = cat("runtime ", runtime / 1000, ".", runtime % 1000 / 10, ", driver ",
                                   driver / 1000, ".", driver % 1000 / 10);
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    inventory.detail = cat(versions, "; no usable device: cudaGetDeviceCount: ", cudaGetErrorString(rc));
    return inventory;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      cudaGetLastError();
      inventory.devices.push_back(cat(d, ": properties unavailable"));
      continue;
    }
    inventory.devices.push_back(cat(d, ": ", prop.name, ", ", format_bytes(prop.totalGlobalMem), ", compute ",
                                    prop.major, ".", prop.minor));
  }
  inventory.detail = count == 0 ? cat(versions, "; no CUDA device visible") : versions;
  return inventory;
}

std::unique_ptr<DeviceCopier> make_cuda_copier(int device) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count) {
    throw Error(ErrorKind::kCuda, cat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  return std::make_unique<CudaCopier>(device);
}

}  // namespace teraio::io
