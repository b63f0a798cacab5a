// io/transfer: the handle of one asynchronous tier write or read. Copyable (all copies watch
// the same transfer) and valid after the tier store that made it is gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace teraio::io {

struct TransferState {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;

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
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<TransferState> state_;
};

}  // namespace teraio::io
