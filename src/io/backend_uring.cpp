// The io_uring backend: one ring per file, submissions under a mutex, one completion thread
// that hands each CQE's result to its request's completion. Requests beyond the ring's depth
// wait in a backlog and are submitted as completions free slots, so submit() never blocks on
// the disk.
#include "teraio/core/error.hpp"
#include "teraio/io/io_backend.hpp"

#if TERAIO_HAVE_URING
#include <liburing.h>
#include <sys/uio.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#endif

namespace teraio::io {

#if TERAIO_HAVE_URING
namespace {

struct UringOp {
  IoRequest request;
  IoCompletion done;
};

class UringBackend final : public IoBackend {
 public:
  UringBackend(int fd, unsigned queue_depth) : fd_(fd), depth_(queue_depth == 0 ? 1 : queue_depth) {
    const int rc = io_uring_queue_init(depth_, &ring_, 0);
    if (rc < 0) throw Error(ErrorKind::kUnsupported, cat("io_uring_queue_init: ", std::strerror(-rc)), -rc);
    completer_ = std::thread([this] { complete_loop(); });
  }

  // Drains: waits for every request in flight or in the backlog, then stops the completion thread.
  ~UringBackend() override {
    {
      std::unique_lock lock(mutex_);
      push_nop_locked();
    }
    completer_.join();
    if (registered_) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);
  }

  std::string name() const override { return "io_uring"; }

  bool register_buffer(void* data, std::size_t size) override {
    iovec vec{data, size};
    std::lock_guard lock(mutex_);
    const int rc = io_uring_register_buffers(&ring_, &vec, 1);
    if (rc < 0) {
      log::info("io_uring buffer registration of ", size, " bytes refused (", std::strerror(-rc),
                "): using unregistered buffers");
      return false;
    }
    registered_ = true;
    return true;
  }

  void submit(const IoRequest& request, IoCompletion done) override {
    auto* op = new UringOp{request, std::move(done)};
    std::lock_guard lock(mutex_);
    if (in_flight_ >= depth_) {
      backlog_.push_back(op);
      return;
    }
    push_locked(op);
  }

 private:
  void push_locked(UringOp* op) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    TERAIO_ASSERT(sqe != nullptr);  // in_flight_ < depth_ guarantees a free entry
    const IoRequest& r = op->request;
    const bool fixed = registered_ && r.registered_buffer >= 0;
    const auto length = static_cast<unsigned>(r.length);
    if (r.direction == IoDirection::kRead) {
      if (fixed) {
        io_uring_prep_read_fixed(sqe, fd_, r.buffer, length, r.offset, r.registered_buffer);
      } else {
        io_uring_prep_read(sqe, fd_, r.buffer, length, r.offset);
      }
    } else if (fixed) {
      io_uring_prep_write_fixed(sqe, fd_, r.buffer, length, r.offset, r.registered_buffer);
    } else {
      io_uring_prep_write(sqe, fd_, r.buffer, length, r.offset);
    }
    io_uring_sqe_set_data(sqe, op);
    ++in_flight_;
    submit_locked();
  }

  void push_nop_locked() {
    // The ring may be full: the NOP goes in when a slot frees (see complete_loop).
    if (in_flight_ >= depth_) {
      nop_pending_ = true;
      return;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    TERAIO_ASSERT(sqe != nullptr);
    io_uring_prep_nop(sqe);
    // IO_DRAIN: the NOP completes only after every request submitted before it.
    io_uring_sqe_set_flags(sqe, IOSQE_IO_DRAIN);
    io_uring_sqe_set_data(sqe, nullptr);
    ++in_flight_;
    submit_locked();
  }

  void submit_locked() {
    int rc;
    do {
      rc = io_uring_submit(&ring_);
    } while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) log::error("io_uring_submit failed: ", std::strerror(-rc));
  }

  void complete_loop() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        log::error("io_uring_wait_cqe failed: ", std::strerror(-rc));
        continue;
      }
      auto* op = static_cast<UringOp*>(io_uring_cqe_get_data(cqe));
      const std::int64_t result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      bool stop = false;
      {
        std::lock_guard lock(mutex_);
        --in_flight_;
        if (op == nullptr) {
          stop = true;
        } else if (!backlog_.empty()) {
          UringOp* next = backlog_.front();
          backlog_.pop_front();
          push_locked(next);
        } else if (nop_pending_) {
          nop_pending_ = false;
          push_nop_locked();
        }
      }
      if (op != nullptr) {
        op->done(result);
        delete op;
      }
      if (stop) {
        std::lock_guard lock(mutex_);
        // Requests resubmitted by completions that ran after the NOP was queued.
        if (in_flight_ == 0 && backlog_.empty()) return;
        push_nop_locked();
      }
    }
  }

  int fd_;
  unsigned depth_;
  io_uring ring_{};
  std::mutex mutex_;
  unsigned in_flight_ = 0;
  std::deque<UringOp*> backlog_;
  bool nop_pending_ = false;
  bool registered_ = false;
  std::thread completer_;
};

}  // namespace

std::unique_ptr<IoBackend> make_uring_backend(int fd, unsigned queue_depth) {
  return std::make_unique<UringBackend>(fd, queue_depth);
}

bool uring_compiled_in() {
  return true;
}

#else

std::unique_ptr<IoBackend> make_uring_backend(int, unsigned) {
  throw Error(ErrorKind::kUnsupported, "this TeraIO build has no io_uring support (liburing not found)");
}

bool uring_compiled_in() {
  return false;
}

#endif

}  // namespace teraio::io
