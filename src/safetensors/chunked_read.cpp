#include "chunked_read.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/thread_name.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/pinned_pool.hpp"

namespace teraio::safetensors::detail {
namespace {

// O_DIRECT moves whole logical blocks; a short read is resumed from the last one reached.
constexpr std::uint64_t kDirectBlock = 512;

struct Chunk {
  std::uint64_t start = 0;      // file offset of the first byte read (aligned when direct)
  std::uint64_t needed = 0;     // bytes from start that the range needs
  std::uint64_t request = 0;    // bytes asked for (needed rounded up to a page when direct)
  std::uint64_t got = 0;        // bytes read so far
  std::byte* memory = nullptr;  // where the read lands: a bounce buffer or the destination
  io::PinnedBuffer bounce;
  std::unique_ptr<io::CopyEvent> copy;
};

struct Completion {
  std::size_t chunk;
  std::int64_t result;
};

class Pipeline {
 public:
  explicit Pipeline(const ChunkedRead& read) : read_(read) {
    const std::uint64_t begin = read.direct ? align_down(read.file_offset, kPageSize) : read.file_offset;
    const std::uint64_t end = read.file_offset + read.length;
    bounce_ = read.direct || read.destination_is_device;
    depth_ = std::max(1u, read.chunks_in_flight);
    pool_ = bounce_ ? read.bounce_pool : nullptr;
    chunk_bytes_ = pool_ != nullptr
                       ? pool_->buffer_bytes()
                       : align_up(std::max<std::uint64_t>(read.chunk_bytes, kPageSize), kPageSize);
    for (std::uint64_t start = begin; start < end; start += chunk_bytes_) {
      Chunk c;
      c.start = start;
      c.needed = std::min(chunk_bytes_, end - start);
      c.request = read.direct ? align_up(c.needed, kPageSize) : c.needed;
      chunks_.push_back(std::move(c));
    }
    if (bounce_ && pool_ == nullptr && !chunks_.empty()) {
      const std::uint64_t buffers = std::min<std::uint64_t>(depth_, chunks_.size());
      own_pool_.emplace(*read.copier, chunk_bytes_, buffers * chunk_bytes_);
      pool_ = &*own_pool_;
    }
  }

  ~Pipeline() { drain(); }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  void run() {
    while (true) {
      while (!error_ && next_ < chunks_.size() && can_start()) start_next();
      if (in_flight_ == 0 && (error_ || next_ == chunks_.size())) break;
      if (in_flight_ == 0) {
        // Every buffer is held by a copy still running: the oldest one frees one.
        finish_oldest_copy();
        continue;
      }
      const Completion done = wait_completion();
      on_read(done);
    }
    drain();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  bool can_start() {
    if (!bounce_) return in_flight_ < depth_;
    while (!copies_.empty() && chunks_[copies_.front()].copy->ready()) finish_oldest_copy();
    // A caller's pool may hold more buffers than this read may keep busy; when it lent every one
    // elsewhere and this read holds none, acquire() waits for one.
    const std::size_t held = in_flight_ + copies_.size();
    return held < depth_ && (held == 0 || pool_->available() > 0);
  }

  void start_next() {
    Chunk& c = chunks_[next_];
    if (bounce_) {
      c.bounce = pool_->acquire();
      c.memory = c.bounce.data();
    } else {
      c.memory = read_.destination + (c.start - read_.file_offset);
    }
    submit(next_);
    ++next_;
  }

  void submit(std::size_t index) {
    Chunk& c = chunks_[index];
    io::IoRequest request;
    request.direction = io::IoDirection::kRead;
    request.buffer = c.memory + c.got;
    request.length = static_cast<std::size_t>(c.request - c.got);
    request.offset = c.start + c.got;
    try {
      read_.backend->submit(request, [this, index](std::int64_t result) {
        // Notified under the lock: once the last completion is seen, run() may return and this
        // pipeline (with its condition variable) be destroyed before an unlocked notify ran.
        std::lock_guard lock(mutex_);
        completions_.push_back({index, result});
        completed_.notify_one();
      });
      ++in_flight_;
    } catch (...) {
      record_error(std::current_exception());
    }
  }

  Completion wait_completion() {
    std::unique_lock lock(mutex_);
    completed_.wait(lock, [&] { return !completions_.empty(); });
    const Completion done = completions_.front();
    completions_.pop_front();
    --in_flight_;
    return done;
  }

  void on_read(const Completion& done) {
    Chunk& c = chunks_[done.chunk];
    const std::string where =
        cat(read_.path, ": read of ", c.request - c.got, " bytes at offset ", c.start + c.got);
    if ((done.result == -EINTR || done.result == -EAGAIN) && !error_) {
      // Transient: the kernel moved nothing, ask again (as IoOperation does for the tier store).
      submit(done.chunk);
      return;
    }
    if (done.result < 0) {
      record_error(std::make_exception_ptr(
          Error(ErrorKind::kIo, cat(where, " failed: ", std::strerror(static_cast<int>(-done.result))),
                static_cast<int>(-done.result))));
      return;
    }
    if (error_) return;
    c.got += static_cast<std::uint64_t>(done.result);
    if (c.got < c.needed) {
      if (done.result == 0) {
        record_error(std::make_exception_ptr(
            Error(ErrorKind::kFormat, cat(where, " hit the end of the file after ", c.got, " of ", c.needed,
                                          " bytes: the data region is truncated"))));
        return;
      }
      if (read_.direct) c.got = align_down(c.got, kDirectBlock);
      submit(done.chunk);
      return;
    }
    if (bounce_) start_copy(done.chunk);
  }

  void start_copy(std::size_t index) {
    Chunk& c = chunks_[index];
    const std::uint64_t first = std::max(c.start, read_.file_offset);
    const std::uint64_t last = c.start + c.needed;
    std::byte* dst = read_.destination + (first - read_.file_offset);
    const std::byte* src = c.bounce.data() + (first - c.start);
    const auto n = static_cast<std::size_t>(last - first);
    try {
      if (read_.destination_is_device) {
        c.copy = read_.copier->to_device(dst, src, n);
        copies_.push_back(index);
      } else {
        std::memcpy(dst, src, n);
        c.bounce = io::PinnedBuffer();
      }
    } catch (...) {
      record_error(std::current_exception());
      c.bounce = io::PinnedBuffer();
    }
  }

  void finish_oldest_copy() {
    Chunk& c = chunks_[copies_.front()];
    copies_.pop_front();
    try {
      c.copy->wait();
    } catch (...) {
      record_error(std::current_exception());
    }
    c.copy.reset();
    c.bounce = io::PinnedBuffer();
  }

  // Waits for every read and copy still running: their buffers and this object must outlive them.
  void drain() {
    while (in_flight_ > 0) (void)wait_completion();
    while (!copies_.empty()) finish_oldest_copy();
  }

  void record_error(std::exception_ptr error) {
    if (!error_) error_ = std::move(error);
  }

  const ChunkedRead& read_;
  std::uint64_t chunk_bytes_ = 0;
  // Declared before the chunks, whose bounce buffers must go back to it before it goes.
  std::optional<io::PinnedBufferPool> own_pool_;
  io::PinnedBufferPool* pool_ = nullptr;  // own_pool_ or the caller's
  std::vector<Chunk> chunks_;
  bool bounce_ = false;
  unsigned depth_ = 1;
  std::size_t next_ = 0;
  std::size_t in_flight_ = 0;
  std::deque<std::size_t> copies_;
  std::exception_ptr error_;
  std::mutex mutex_;
  std::condition_variable completed_;
  std::deque<Completion> completions_;
};

// Reads [offset, offset + n) of a buffered fd into memory, resuming short reads.
void pread_fully(int fd, const std::string& path, std::byte* memory, std::uint64_t n, std::uint64_t offset) {
  std::uint64_t got = 0;
  while (got < n) {
    const ssize_t rc =
        ::pread(fd, memory + got, static_cast<std::size_t>(n - got), static_cast<off_t>(offset + got));
    const int error = errno;
    if (rc < 0 && (error == EINTR || error == EAGAIN)) continue;
    if (rc <= 0) {
      const std::string where = cat(path, ": read of ", n - got, " bytes at offset ", offset + got);
      if (rc < 0) throw Error(ErrorKind::kIo, cat(where, " failed: ", std::strerror(error)), error);
      throw Error(ErrorKind::kFormat, cat(where, " hit the end of the file after ", got, " of ", n,
                                          " bytes: the data region is truncated"));
    }
    got += static_cast<std::uint64_t>(rc);
  }
}

// The pieces of a buffered read, handed out to its threads one at a time, so that a slow thread
// delays the load by one piece at most; the first failure stops every thread.
class PieceReader {
 public:
  PieceReader(const ParallelRead& read, io::PinnedBufferPool* pool, std::uint64_t piece_bytes)
      : read_(read),
        pool_(pool),
        piece_bytes_(piece_bytes),
        pieces_((read.length + piece_bytes - 1) / piece_bytes) {}

  std::uint64_t pieces() const { return pieces_; }

  // One thread's share of the work; never throws (the first error is kept for rethrow()).
  void work() noexcept {
    io::PinnedBuffer buffer;
    // Two halves of the thread's bounce buffer: one is read into while the other is copied.
    std::unique_ptr<io::CopyEvent> copies[2];
    try {
      if (pool_ != nullptr) buffer = pool_->acquire();
      for (unsigned half = 0;; half ^= 1u) {
        const std::uint64_t index = next_.fetch_add(1);
        if (index >= pieces_ || failed_.load()) break;
        const std::uint64_t start = index * piece_bytes_;
        const std::uint64_t n = std::min(piece_bytes_, read_.length - start);
        std::byte* destination = read_.destination + start;
        if (pool_ == nullptr) {
          pread_fully(read_.fd, read_.path, destination, n, read_.file_offset + start);
          continue;
        }
        if (copies[half]) {
          copies[half]->wait();
          copies[half].reset();
        }
        std::byte* bounce = buffer.data() + half * piece_bytes_;
        pread_fully(read_.fd, read_.path, bounce, n, read_.file_offset + start);
        copies[half] = read_.copier->to_device(destination, bounce, static_cast<std::size_t>(n));
      }
    } catch (...) {
      fail(std::current_exception());
    }
    // The buffer goes back to the pool only once no copy reads it any more.
    for (auto& copy : copies) {
      if (!copy) continue;
      try {
        copy->wait();
      } catch (...) {
        fail(std::current_exception());
      }
    }
  }

  void fail(std::exception_ptr error) noexcept {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::move(error);
    failed_.store(true);
  }

  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  const ParallelRead& read_;
  io::PinnedBufferPool* pool_;
  std::uint64_t piece_bytes_;
  std::uint64_t pieces_;
  std::atomic<std::uint64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

}  // namespace

void run_parallel_read(const ParallelRead& read) {
  if (read.length == 0) return;
  const unsigned wanted = std::max(1u, read.threads);
  std::optional<io::PinnedBufferPool> own_pool;
  io::PinnedBufferPool* pool = nullptr;
  std::uint64_t piece_bytes = 0;
  if (read.destination_is_device) {
    pool = read.bounce_pool;
    const std::uint64_t buffer_bytes =
        pool != nullptr ? pool->buffer_bytes()
                        : align_up(std::max<std::uint64_t>(read.chunk_bytes, 2 * kPageSize), 2 * kPageSize);
    piece_bytes = buffer_bytes / 2;
    if (pool == nullptr) {
      const std::uint64_t pieces = (read.length + piece_bytes - 1) / piece_bytes;
      const std::uint64_t buffers = std::min<std::uint64_t>(wanted, (pieces + 1) / 2);
      own_pool.emplace(*read.copier, buffer_bytes, buffers * buffer_bytes);
      pool = &*own_pool;
    }
  } else {
    piece_bytes = align_up(std::max<std::uint64_t>(read.chunk_bytes / 2, kPageSize), kPageSize);
  }
  PieceReader reader(read, pool, piece_bytes);
  std::uint64_t threads = std::min<std::uint64_t>(wanted, reader.pieces());
  if (pool != nullptr) threads = std::min<std::uint64_t>(threads, pool->buffer_count());
  {
    std::vector<std::jthread> helpers;
    try {
      for (std::uint64_t i = 1; i < threads; ++i) {
        helpers.emplace_back([&reader] {
          name_this_thread("teraio-st-read");
          reader.work();
        });
      }
    } catch (...) {
      // Fewer threads than asked for: the ones running (and this one) still read every piece.
      log::debug("safetensors: started ", helpers.size() + 1, " of ", threads, " read threads");
    }
    reader.work();
  }
  reader.rethrow();
}

void run_chunked_read(const ChunkedRead& read) {
  if (read.length == 0) return;
  Pipeline pipeline(read);
  pipeline.run();
}

}  // namespace teraio::safetensors::detail
