#include "device_wait_clock.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "cuda_check.hpp"
#endif

namespace teraio::torch_binding {

const char* to_string(DeviceWaitKind kind) {
  switch (kind) {
    case DeviceWaitKind::kCopyOut: return "copy out";
    case DeviceWaitKind::kCopyIn: return "copy in";
    case DeviceWaitKind::kAbandoned: return "abandoned copy out";
  }
  return "?";
}

namespace {

// The host copier's copies have completed when they return: nothing is ever waited for.
class HostWaitClock final : public DeviceWaitClock {
 public:
  void block(io::CopyEvent& copy, std::uint32_t, DeviceWaitKind, std::uint64_t) override { copy.wait(); }
  std::size_t block_started(io::CopyEvent& copy, std::uint32_t, std::uint64_t) override {
    copy.wait();
    return 0;
  }
  double collect(std::vector<DeviceWait>*) override { return 0; }
};

#ifdef TERAIO_TORCH_CUDA
// Event pairs are kept across steps: a planned step hands hundreds of waits to the device.
class CudaWaitClock final : public DeviceWaitClock {
 public:
  explicit CudaWaitClock(c10::Device device) : device_(device) {}
  ~CudaWaitClock() override {
    for (auto& [before, after] : pairs_) {
      cudaEventDestroy(before);
      cudaEventDestroy(after);
    }
  }
  CudaWaitClock(const CudaWaitClock&) = delete;
  CudaWaitClock& operator=(const CudaWaitClock&) = delete;

  void block(io::CopyEvent& copy, std::uint32_t op, DeviceWaitKind kind, std::uint64_t tensor) override {
    measured(op, kind, tensor, [&](cudaStream_t stream) { return copy.block_stream(stream); });
  }
  std::size_t block_started(io::CopyEvent& copy, std::uint32_t op, std::uint64_t tensor) override {
    std::size_t dropped = 0;
    measured(op, DeviceWaitKind::kAbandoned, tensor, [&](cudaStream_t stream) {
      dropped = copy.abandon(stream);
      return io::StreamWait::kFlushed;  // its rest dropped, or queued behind what it has started
    });
    return dropped;
  }

  double collect(std::vector<DeviceWait>* waits) override {
    double total = 0;
    if (used_ > 0) check_cuda(cudaEventSynchronize(pairs_[used_ - 1].second), "cudaEventSynchronize");
    for (std::size_t i = 0; i < used_; ++i) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, pairs_[i].first, pairs_[i].second), "cudaEventElapsedTime");
      const double seconds = static_cast<double>(ms) / 1e3;
      total += seconds;
      if (waits == nullptr || ms <= 0) continue;
      float since_first = 0;
      check_cuda(cudaEventElapsedTime(&since_first, pairs_[0].first, pairs_[i].first),
                 "cudaEventElapsedTime");
      waits->push_back(DeviceWait{tags_[i].op, tags_[i].kind, seconds, tags_[i].how,
                                  static_cast<double>(since_first) / 1e3, tags_[i].tensor});
    }
    used_ = 0;
    return total;
  }

 private:
  // Queues `wait` on the compute stream between two events that time it; `wait` returns where
  // the copy stood (io::StreamWait).
  template <typename Wait>
  void measured(std::uint32_t op, DeviceWaitKind kind, std::uint64_t tensor, Wait&& wait) {
    if (used_ == pairs_.size()) {
      cudaEvent_t before = nullptr;
      cudaEvent_t after = nullptr;
      check_cuda(cudaEventCreate(&before), "cudaEventCreate");
      check_cuda(cudaEventCreate(&after), "cudaEventCreate");
      pairs_.emplace_back(before, after);
      tags_.emplace_back();
    }
    tags_[used_] = DeviceWait{op, kind, 0, io::StreamWait::kQueued, 0, tensor};
    auto [before, after] = pairs_[used_];
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    check_cuda(cudaEventRecord(before, stream), "cudaEventRecord(before a device wait)");
    tags_[used_].how = wait(stream);
    check_cuda(cudaEventRecord(after, stream), "cudaEventRecord(after a device wait)");
    ++used_;
  }

  c10::Device device_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pairs_;
  std::vector<DeviceWait> tags_;  // beside pairs_: what each wait was for
  std::size_t used_ = 0;
};
#endif

}  // namespace

std::unique_ptr<DeviceWaitClock> make_device_wait_clock(c10::Device device) {
#ifdef TERAIO_TORCH_CUDA
  if (device.is_cuda()) return std::make_unique<CudaWaitClock>(device);
#endif
  static_cast<void>(device);
  return std::make_unique<HostWaitClock>();
}

}  // namespace teraio::torch_binding
