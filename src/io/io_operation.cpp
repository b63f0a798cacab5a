#include "io_operation.hpp"

#include <cerrno>
#include <cstring>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {
namespace {
// A transfer that keeps ending short without crossing a page boundary is not making progress.
constexpr std::uint64_t kMaxStalls = 64;
// O_DIRECT moves whole logical blocks (512 bytes or more): resuming from the last 512-byte
// boundary keeps offset, length and buffer address acceptable to the kernel.
constexpr std::uint64_t kDirectResumeAlignment = 512;
}  // namespace

std::shared_ptr<IoOperation> IoOperation::start(IoBackend& backend, const IoRequest& request,
                                                std::string path, bool direct_io) {
  auto op = std::make_shared<IoOperation>(backend, request, std::move(path), direct_io);
  if (request.length == 0) {
    op->finish(nullptr);
  } else {
    op->submit_from(0);
  }
  return op;
}

std::string IoOperation::describe() const {
  return cat(request_.direction == IoDirection::kRead ? "read" : "write", " of ", request_.length,
             " bytes at offset ", request_.offset, " of ", path_, " (", backend_.name(), ")");
}

void IoOperation::submit_from(std::uint64_t done) {
  IoRequest part = request_;
  part.buffer = static_cast<std::byte*>(request_.buffer) + done;
  part.length = request_.length - done;
  part.offset = request_.offset + done;
  try {
    backend_.submit(
        part, [self = shared_from_this(), done](std::int64_t result) { self->on_complete(done, result); });
  } catch (...) {
    finish(std::current_exception());
  }
}

void IoOperation::on_complete(std::uint64_t started_at, std::int64_t result) {
  try {
    if (result == -EINTR || result == -EAGAIN) {
      submit_from(started_at);
      return;
    }
    if (result < 0) {
      const int err = static_cast<int>(-result);
      throw_system_error(cat(describe(), " failed at byte ", started_at), err);
    }
    if (result == 0) {
      throw Error(ErrorKind::kIo, cat(describe(), ": transfer stopped after ", started_at,
                                      " bytes (the kernel moved 0 bytes: end of file?)"));
    }
    const std::uint64_t reached = started_at + static_cast<std::uint64_t>(result);
    if (reached > request_.length) throw_internal(cat(describe(), ": backend reported ", reached, " bytes"));
    if (reached == request_.length) {
      finish(nullptr);
      return;
    }
    const std::uint64_t resume = direct_io_ ? align_down(reached, kDirectResumeAlignment) : reached;
    if (resume <= started_at && ++stalls_ > kMaxStalls) {
      throw Error(ErrorKind::kIo,
                  cat(describe(), ": short transfers make no progress past byte ", started_at));
    }
    submit_from(resume);
  } catch (...) {
    finish(std::current_exception());
  }
}

void IoOperation::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    done_ = true;
  }
  finished_.notify_all();
}

void IoOperation::wait() {
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool IoOperation::ready() {
  std::lock_guard lock(mutex_);
  return done_;
}

}  // namespace teraio::io
