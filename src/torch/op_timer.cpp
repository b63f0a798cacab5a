#include "op_timer.hpp"

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "cuda_check.hpp"
#endif

namespace teraio::torch_binding {
namespace {

class WallTimer final : public OpTimer {
 public:
  void reset() override { spans_.clear(); }
  void start(std::size_t op) override {
    if (spans_.size() <= op) spans_.resize(op + 1);
    spans_[op].first = std::chrono::steady_clock::now();
  }
  void stop(std::size_t op) override {
    if (spans_.size() <= op) spans_.resize(op + 1);
    spans_[op].second = std::chrono::steady_clock::now();
  }
  std::vector<double> durations(std::size_t ops) override {
    std::vector<double> out(ops, 0.0);
    for (std::size_t i = 0; i < ops && i < spans_.size(); ++i) {
      const auto d = std::chrono::duration<double>(spans_[i].second - spans_[i].first).count();
      out[i] = d > 0 ? d : 0;
    }
    return out;
  }

 private:
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> spans_;
};

#ifdef TERAIO_TORCH_CUDA
// Events are kept across steps: creating thousands per step would cost more than the ops.
class CudaTimer final : public OpTimer {
 public:
  explicit CudaTimer(c10::Device device) : device_(device) {}
  ~CudaTimer() override {
    for (auto& [a, b] : events_) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
  void reset() override { recorded_.assign(events_.size(), false); }
  void start(std::size_t op) override { record(op, true); }
  void stop(std::size_t op) override { record(op, false); }
  std::vector<double> durations(std::size_t ops) override {
    std::vector<double> out(ops, 0.0);
    for (std::size_t i = 0; i < ops && i < events_.size(); ++i) {
      if (!recorded_[i]) continue;
      check_cuda(cudaEventSynchronize(events_[i].second), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second), "cudaEventElapsedTime");
      out[i] = static_cast<double>(ms) / 1e3;
    }
    return out;
  }

 private:
  void record(std::size_t op, bool first) {
    while (events_.size() <= op) {
      cudaEvent_t a = nullptr;
      cudaEvent_t b = nullptr;
      check_cuda(cudaEventCreate(&a), "cudaEventCreate");
      check_cuda(cudaEventCreate(&b), "cudaEventCreate");
      events_.emplace_back(a, b);
      recorded_.push_back(false);
    }
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    check_cuda(cudaEventRecord(first ? events_[op].first : events_[op].second, stream), "cudaEventRecord");
    if (!first) recorded_[op] = true;
  }

  c10::Device device_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  std::vector<bool> recorded_;
};
#endif

}  // namespace

std::unique_ptr<OpTimer> make_op_timer(c10::Device device) {
#ifdef TERAIO_TORCH_CUDA
  if (device.is_cuda()) return std::make_unique<CudaTimer>(device);
#endif
  if (!device.is_cpu())
    throw Error(ErrorKind::kUnsupported, cat("no operator timer for device ", device.str()));
  return std::make_unique<WallTimer>();
}

}  // namespace teraio::torch_binding
