// io/transfer: the handle of one asynchronous tier write or read. Copyable (all copies watch
// the same transfer) and valid after the tier store that made it is gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "teraio/io/device_copy.hpp"

namespace teraio::io {

struct TransferState {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  // Set before the transfer is handed out, constant afterwards (see Transfer::device_side).
  std::shared_ptr<CopyEvent> device_side;

  void finish(std::exception_ptr failure);
};

class Transfer {
 public:
  Transfer() = default;
  explicit Transfer(std::shared_ptr<TransferState> state) : state_(std::move(state)) {}

  // Blocks until the transfer is done; rethrows its failure as teraio::Error (kIo, kNoSpace,
  // kChecksum, kShutdown, ...). May be called any number of times.
  void wait() const;
  // True once the transfer has finished, successfully or not.
  bool ready() const;
  // Waits at most timeout; true when finished (then wait() returns or throws at once).
  bool wait_for(std::chrono::nanoseconds timeout) const;
  // How many transfers of this process have finished so far. A transfer counts after it is
  // ready(): one that was not ready when this was read becomes ready only with a larger count,
  // so a poller that saw no change can skip looking at each transfer it watches.
  static std::uint64_t finished_count();
  bool valid() const { return state_ != nullptr; }
  // For a transfer whose device-memory side is one copy enqueued when it was submitted (host
  // tier <-> CUDA device memory): that copy's event. Work ordered after it on the device
  // (CopyEvent::block_stream) may reuse a write's source or use a read's destination before
  // the transfer as a whole is seen done on the host. Null otherwise: then only wait() or
  // ready() tell when the device memory is free or filled.
  CopyEvent* device_side() const { return state_ ? state_->device_side.get() : nullptr; }

 private:
  std::shared_ptr<TransferState> state_;
};

}  // namespace teraio::io
