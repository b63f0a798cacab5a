// torch/device_wait_clock: the GPU time the compute stream spends waiting for copies that the
// executor handed to the device (TensorMemory::release_after / use_after) instead of waiting on
// the host. Those waits do not block the operator thread, so the host cannot see them; events
// recorded on the compute stream right before and after each wait measure them.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "teraio/io/device_copy.hpp"

namespace teraio::torch_binding {

// What the compute stream waited for: a copy out before the memory is reused, a copy in before
// the tensor is used, or the started bytes of a copy out given up.
enum class DeviceWaitKind : std::uint8_t { kCopyOut, kCopyIn, kAbandoned };
const char* to_string(DeviceWaitKind kind);

// One wait that held the compute stream, with the operator whose callbacks queued it (the wait
// holds that operator's kernels, or the next one's where it was queued after the operator).
struct DeviceWait {
  std::uint32_t op = 0;
  DeviceWaitKind kind = DeviceWaitKind::kCopyIn;
  double seconds = 0;
  // Where the copy stood as the wait was queued: all of it on the lane's stream already, its
  // rest flushed onto it then, or onto the side stream behind its compute marker (gated).
  // Abandoned copies count as flushed.
  io::StreamWait how = io::StreamWait::kQueued;
  // When the compute stream reached the wait: GPU seconds since it reached the step's first wait
  // (measured or not). The GPU time between two waits less the profile's operator times between
  // them is time the step spends outside the waits that the plan does not count (host late,
  // slower kernels): bench/device_stalls.py adds it up by stretch.
  double at = 0;
  // The tensor whose copy it waited for (the plan's and the trace's id): which migration ran
  // late, for bench/device_stalls.py to set against the plan (session 39 found single 16 MiB
  // copies with 10-41 ms of simulated slack waiting 15-43 ms, known only by operator then).
  std::uint64_t tensor = 0;
};

class DeviceWaitClock {
 public:
  virtual ~DeviceWaitClock() = default;
  // Makes the device's current compute stream wait for `copy` (the CPU: waits on the host);
  // `op` and `kind` say which operator queued the wait and why (collect's waits).
  virtual void block(io::CopyEvent& copy, std::uint32_t op, DeviceWaitKind kind, std::uint64_t tensor) = 0;
  // The same for a copy no longer wanted: waits for the bytes it has started only
  // (CopyEvent::abandon). Returns the bytes it will not copy.
  virtual std::size_t block_started(io::CopyEvent& copy, std::uint32_t op, std::uint64_t tensor) = 0;
  // Seconds the compute stream waited since the last call. Waits for the latest measured wait
  // to have passed on the device (one host synchronization per call: call it once per step).
  // `waits`, when given, receives each wait that held the stream (any time at all), in order.
  virtual double collect(std::vector<DeviceWait>* waits = nullptr) = 0;
};

std::unique_ptr<DeviceWaitClock> make_device_wait_clock(c10::Device device);

}  // namespace teraio::torch_binding
