// The io_uring backend: one ring per file, submissions under a mutex, one completion thread
// that hands each CQE's result to its request's completion. Requests beyond the ring's depth
// wait in a backlog and are submitted as completions free slots, so submit() never blocks on
// the disk. A request the kernel refuses to take (io_uring_submit failing) is taken back out
// of the ring and failed, so no request is ever left waiting for a completion that cannot come.
#include "teraio/core/error.hpp"
#include "teraio/core/thread_name.hpp"
#include "teraio/io/io_backend.hpp"

#if TERAIO_HAVE_URING
#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#endif

namespace teraio::io {

#if TERAIO_HAVE_URING
namespace {

// An SQE's length is 32 bits and the kernel moves at most ~2 GiB per request: longer requests
// are cut here and the caller resumes the short transfer (see IoOperation).
constexpr std::size_t kMaxRequestBytes = kGiB;
// io_uring_submit's EAGAIN/EBUSY are transient (kernel allocation, completion ring backlog
// that the completion thread is reaping): retried this many times before the request fails.
constexpr int kSubmitRetries = 1000;

struct UringOp {
  IoRequest request;
  IoCompletion done;
};

struct FailedOp {
  std::unique_ptr<UringOp> op;
  int error;
};

class UringBackend final : public IoBackend {
 public:
  UringBackend(int fd, unsigned queue_depth) : fd_(fd), depth_(queue_depth == 0 ? 1 : queue_depth) {
    const int rc = io_uring_queue_init(depth_, &ring_, 0);
    if (rc < 0) throw Error(ErrorKind::kUnsupported, cat("io_uring_queue_init: ", std::strerror(-rc)), -rc);
    completer_ = std::thread([this] {
      name_this_thread("teraio-uring");
      complete_loop();
    });
  }

  // Drains: every request in flight or in the backlog completes before the ring goes away.
  ~UringBackend() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
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
    auto op = std::make_unique<UringOp>(UringOp{request, std::move(done)});
    {
      std::lock_guard lock(mutex_);
      if (in_flight_ >= depth_) {
        backlog_.push_back(std::move(op));
        return;
      }
      const int rc = push_locked(op.get());
      if (rc < 0) {
        // Taken back out of the ring: its completion will never run, as submit() promises on throw.
        throw Error(ErrorKind::kIo,
                    cat("io_uring_submit of a ", request.length, "-byte request at offset ", request.offset,
                        ": ", std::strerror(-rc)),
                    -rc);
      }
      static_cast<void>(op.release());  // owned by the ring until its CQE is reaped
      // Under the lock: the request may complete, and its waiter destroy this backend, before
      // an unlocked notify would run.
      wake_.notify_one();
    }
  }

 private:
  // Returns 0, or -errno when the kernel refused the request (it is then no longer in the ring).
  int push_locked(UringOp* op) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    TERAIO_ASSERT(sqe != nullptr);  // in_flight_ < depth_ guarantees a free entry
    const IoRequest& r = op->request;
    const bool fixed = registered_ && r.registered_buffer >= 0;
    const auto length = static_cast<unsigned>(std::min(r.length, kMaxRequestBytes));
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
    int rc = 0;
    for (int attempt = 0; attempt <= kSubmitRetries; ++attempt) {
      rc = io_uring_submit(&ring_);
      if (rc > 0) break;
      // 0: the kernel took nothing this time; like EAGAIN/EBUSY, worth another try.
      if (rc == -EINTR || rc == 0) continue;
      if (rc != -EAGAIN && rc != -EBUSY) break;
      std::this_thread::yield();
    }
    if (rc == 0) rc = -EAGAIN;
    if (rc > 0) {
      ++in_flight_;
      return 0;
    }
    take_back_unsubmitted_locked();
    return rc;
  }

  // io_uring_submit publishes the entry to the kernel before entering it; when entering fails
  // the kernel has consumed nothing, and the entry would otherwise run with the next successful
  // submit, after its request has been failed and freed. Every submit() pushes exactly one
  // entry and takes it back on failure, so what is unconsumed is exactly that one entry.
  void take_back_unsubmitted_locked() {
    const unsigned consumed = io_uring_smp_load_acquire(ring_.sq.khead);
    ring_.sq.sqe_tail = consumed;
    ring_.sq.sqe_head = consumed;
    io_uring_smp_store_release(ring_.sq.ktail, consumed);
  }

  // Moves backlog entries into the ring while it has room; those the kernel refuses are
  // returned to be failed outside the lock (their completions may submit again).
  void refill_locked(std::vector<FailedOp>& failed) {
    while (!backlog_.empty() && in_flight_ < depth_) {
      std::unique_ptr<UringOp> next = std::move(backlog_.front());
      backlog_.pop_front();
      const int rc = push_locked(next.get());
      if (rc < 0) {
        failed.push_back({std::move(next), rc});
      } else {
        static_cast<void>(next.release());
      }
    }
  }

  void complete_loop() {
    for (;;) {
      {
        // Waits on the ring only while a CQE is owed: every counted request was taken by the
        // kernel, so the wait below always ends, and shutdown needs no wake-up entry.
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return in_flight_ > 0 || stopping_; });
        if (in_flight_ == 0)
          return;  // stopping, nothing owed (the backlog is empty when nothing is in flight)
      }
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        log::error("io_uring_wait_cqe failed: ", std::strerror(-rc));
        std::this_thread::yield();
        continue;
      }
      std::unique_ptr<UringOp> op(static_cast<UringOp*>(io_uring_cqe_get_data(cqe)));
      const std::int64_t result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      std::vector<FailedOp> failed;
      {
        std::lock_guard lock(mutex_);
        --in_flight_;
        refill_locked(failed);
      }
      op->done(result);
      for (FailedOp& f : failed) f.op->done(f.error);
    }
  }

  int fd_;
  unsigned depth_;
  io_uring ring_{};
  std::mutex mutex_;
  std::condition_variable wake_;
  unsigned in_flight_ = 0;  // entries the kernel has taken and not yet completed
  std::deque<std::unique_ptr<UringOp>> backlog_;
  bool stopping_ = false;
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
