// io/io_backend: asynchronous block I/O on one open file, the seam between the tier store and
// the kernel. Implementations: io_uring (liburing, when built with it) and a POSIX thread
// pool (pread/pwrite). A backend reports the raw result of each request, exactly as the
// kernel gave it (bytes or -errno): checking errors and resuming short transfers is the
// caller's job (see IoOperation), so a test double can inject failures and short transfers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace teraio::io {

enum class IoDirection { kRead, kWrite };

struct IoRequest {
  IoDirection direction = IoDirection::kRead;
  void* buffer = nullptr;
  std::size_t length = 0;
  std::uint64_t offset = 0;
  // Index of a buffer registered with the backend (io_uring fixed buffers), -1 for none.
  int registered_buffer = -1;
};

// Called exactly once per request, from any thread, with bytes transferred or -errno.
using IoCompletion = std::function<void(std::int64_t result)>;

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  // "io_uring", "posix" (or a test double's name): reported per path.
  virtual std::string name() const = 0;
  // Queues a request; never blocks on the transfer itself. Throws only when the request cannot
  // be queued at all (the completion is then never called).
  virtual void submit(const IoRequest& request, IoCompletion done) = 0;
  // Registers [data, data + size) for zero-copy requests (registered_buffer = 0); returns false
  // when the backend does not support or refuses it. Call before submitting any request.
  virtual bool register_buffer(void* data, std::size_t size) = 0;
};

// A pool of threads running pread/pwrite on fd (not owned).
std::unique_ptr<IoBackend> make_posix_backend(int fd, unsigned threads);
// One io_uring with queue_depth entries and a completion thread, on fd (not owned).
// Throws Error{kUnsupported} when the build has no liburing or the kernel refuses io_uring.
std::unique_ptr<IoBackend> make_uring_backend(int fd, unsigned queue_depth);
bool uring_compiled_in();

}  // namespace teraio::io
