#include "chunked_read.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
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
    chunk_bytes_ = align_up(std::max<std::uint64_t>(read.chunk_bytes, kPageSize), kPageSize);
    for (std::uint64_t start = begin; start < end; start += chunk_bytes_) {
      Chunk c;
      c.start = start;
      c.needed = std::min(chunk_bytes_, end - start);
      c.request = read.direct ? align_up(c.needed, kPageSize) : c.needed;
      chunks_.push_back(std::move(c));
    }
    bounce_ = read.direct || read.destination_is_device;
    const unsigned depth = std::max(1u, read.chunks_in_flight);
    if (bounce_ && !chunks_.empty()) {
      const std::uint64_t buffers = std::min<std::uint64_t>(depth, chunks_.size());
      pool_.emplace(*read.copier, chunk_bytes_, buffers * chunk_bytes_);
    }
    depth_ = depth;
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
    if (pool_->available() > 0) return true;
    return false;
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
  std::optional<io::PinnedBufferPool> pool_;
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

}  // namespace

void run_chunked_read(const ChunkedRead& read) {
  if (read.length == 0) return;
  Pipeline pipeline(read);
  pipeline.run();
}

}  // namespace teraio::safetensors::detail
