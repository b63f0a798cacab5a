#include "device_wait_clock.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "cuda_check.hpp"
#endif

namespace teraio::torch_binding {
namespace {

// The host copier's copies have completed when they return: nothing is ever waited for.
class HostWaitClock final : public DeviceWaitClock {
 public:
  void block(io::CopyEvent& copy) override { copy.wait(); }
  std::size_t block_started(io::CopyEvent& copy) override {
    copy.wait();
    return 0;
  }
  double collect() override { return 0; }
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

  void block(io::CopyEvent& copy) override {
    measured([&](cudaStream_t stream) { copy.block_stream(stream); });
  }
  std::size_t block_started(io::CopyEvent& copy) override {
    std::size_t dropped = 0;
    measured([&](cudaStream_t stream) { dropped = copy.abandon(stream); });
    return dropped;
  }

  double collect() override {
    double total = 0;
    if (used_ > 0) check_cuda(cudaEventSynchronize(pairs_[used_ - 1].second), "cudaEventSynchronize");
    for (std::size_t i = 0; i < used_; ++i) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, pairs_[i].first, pairs_[i].second), "cudaEventElapsedTime");
      total += static_cast<double>(ms) / 1e3;
    }
    used_ = 0;
    return total;
  }

 private:
  // Queues `wait` on the compute stream between two events that time it.
  template <typename Wait>
  void measured(Wait&& wait) {
    if (used_ == pairs_.size()) {
      cudaEvent_t before = nullptr;
      cudaEvent_t after = nullptr;
      check_cuda(cudaEventCreate(&before), "cudaEventCreate");
      check_cuda(cudaEventCreate(&after), "cudaEventCreate");
      pairs_.emplace_back(before, after);
    }
    auto [before, after] = pairs_[used_];
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    check_cuda(cudaEventRecord(before, stream), "cudaEventRecord(before a device wait)");
    wait(stream);
    check_cuda(cudaEventRecord(after, stream), "cudaEventRecord(after a device wait)");
    ++used_;
  }

  c10::Device device_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pairs_;
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
