// torch/device_wait_clock: the GPU time the compute stream spends waiting for copies that the
// executor handed to the device (TensorMemory::release_after / use_after) instead of waiting on
// the host. Those waits do not block the operator thread, so the host cannot see them; events
// recorded on the compute stream right before and after each wait measure them.
#pragma once

#include <c10/core/Device.h>

#include <memory>

#include "teraio/io/device_copy.hpp"

namespace teraio::torch_binding {

class DeviceWaitClock {
 public:
  virtual ~DeviceWaitClock() = default;
  // Makes the device's current compute stream wait for `copy` (the CPU: waits on the host).
  virtual void block(io::CopyEvent& copy) = 0;
  // The same for a copy no longer wanted: waits for the bytes it has started only
  // (CopyEvent::abandon). Returns the bytes it will not copy.
  virtual std::size_t block_started(io::CopyEvent& copy) = 0;
  // Seconds the compute stream waited since the last call. Waits for the latest measured wait
  // to have passed on the device (one host synchronization per call: call it once per step).
  virtual double collect() = 0;
};

std::unique_ptr<DeviceWaitClock> make_device_wait_clock(c10::Device device);

}  // namespace teraio::torch_binding
