// The portable backend: a thread pool issuing one pread/pwrite per request. Several threads
// keep several requests in flight per file, which O_DIRECT needs for full bandwidth.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "teraio/core/thread_name.hpp"
#include "teraio/io/io_backend.hpp"

namespace teraio::io {
namespace {

class PosixBackend final : public IoBackend {
 public:
  PosixBackend(int fd, unsigned threads) : fd_(fd) {
    const unsigned count = std::max(1u, threads);
    workers_.reserve(count);
    for (unsigned i = 0; i < count; ++i) {
      workers_.emplace_back([this] {
        name_this_thread("teraio-posix-io");
        run();
      });
    }
  }

  // Drains: every queued request is still carried out and completed.
  ~PosixBackend() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  std::string name() const override { return "posix"; }

  void submit(const IoRequest& request, IoCompletion done) override {
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(request, std::move(done));
    }
    queued_.notify_one();
  }

  bool register_buffer(void*, std::size_t) override { return false; }

 private:
  void run() {
    for (;;) {
      std::pair<IoRequest, IoCompletion> item;
      {
        std::unique_lock lock(mutex_);
        queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      const IoRequest& r = item.first;
      ssize_t n;
      do {
        n = r.direction == IoDirection::kRead ? pread(fd_, r.buffer, r.length, static_cast<off_t>(r.offset))
                                              : pwrite(fd_, r.buffer, r.length, static_cast<off_t>(r.offset));
      } while (n < 0 && errno == EINTR);
      item.second(n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n));
    }
  }

  int fd_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::pair<IoRequest, IoCompletion>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> make_posix_backend(int fd, unsigned threads) {
  return std::make_unique<PosixBackend>(fd, threads);
}

}  // namespace teraio::io
