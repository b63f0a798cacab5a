// torch/op_timer: how long each operator of a profiled step ran. On the CPU the operator
// runs inside its callbacks, so wall time between them is its time; on CUDA kernels run
// asynchronously, so events recorded on the compute stream around the operator measure it.
// Both start after the observer's own waits for transfers, which are not the operator's time.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <vector>

namespace teraio::torch_binding {

class OpTimer {
 public:
  virtual ~OpTimer() = default;
  // Starts a new step's measurements.
  virtual void reset() = 0;
  virtual void start(std::size_t op) = 0;
  virtual void stop(std::size_t op) = 0;
  // Seconds per operator of the step (waits for the device where needed); 0 for unmeasured ones.
  virtual std::vector<double> durations(std::size_t ops) = 0;
};

std::unique_ptr<OpTimer> make_op_timer(c10::Device device);

}  // namespace teraio::torch_binding
