// torch/fault_injection: an I/O backend wrapper that fails requests on command, so tests can
// show that a storage-engine fault ends a training step with a clear exception, no hang and
// no lost tensor. Only reachable through the session's test configuration.
#pragma once

#include <atomic>
#include <memory>

#include "teraio/io/io_backend.hpp"

namespace teraio::torch_binding {

struct FaultSwitch {
  std::atomic<bool> fail_reads{false};
  std::atomic<bool> fail_writes{false};
};

std::unique_ptr<io::IoBackend> make_faulty_backend(std::unique_ptr<io::IoBackend> real,
                                                   std::shared_ptr<FaultSwitch> faults);

}  // namespace teraio::torch_binding
