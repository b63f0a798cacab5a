#include "copy_lane_cuda.hpp"

#include <algorithm>
#include <chrono>

#include "teraio/core/strings.hpp"
#include "teraio/core/thread_name.hpp"

namespace teraio::io::cuda_detail {

// A copy's completion as the engine sees it. The host waits on the lane's bookkeeping; a
// stream waits on the event of the copy's last chunk, queued first if need be.
class CopyLane::Event final : public CopyEvent {
 public:
  Event(std::shared_ptr<CopyLane> lane, std::shared_ptr<Copy> copy)
      : lane_(std::move(lane)), copy_(std::move(copy)) {}

  bool ready() override {
    std::lock_guard lock(lane_->mutex_);
    if (copy_->complete && copy_->error) std::rethrow_exception(copy_->error);
    return copy_->complete;
  }
  // Only observes, and moves nothing forward: the engine's watchers wait on every copy, and
  // queuing each one here would put them back in issue order. A stream that needs a copy now
  // calls block_stream, which does queue it.
  void wait() override {
    std::unique_lock lock(lane_->mutex_);
    lane_->progress_.wait(lock, [&] { return copy_->complete; });
    if (copy_->error) std::rethrow_exception(copy_->error);
  }
  StreamWait block_stream(void* stream) override {
    std::unique_lock lock(lane_->mutex_);
    // Its event may serve another copy by now: nothing to wait for.
    if (copy_->complete) return StreamWait::kDone;
    // A plan served and the GPU short of the copy's marker: where the waits orders have the
    // device or the host wait instead of gating the copy.
    const bool ahead_of_marker = lane_->serving_plan_ && copy_->marker > lane_->passed_marker_;
    if (lane_->options_.device_waits && ahead_of_marker) {
      if (const auto flag = lane_->await(copy_)) {
        // Outside the lock, as every wait queued on a compute stream here: a stream whose
        // launch queue is full blocks the call until the GPU moves on, which may take a flag
        // the dispatcher sets, and the dispatcher takes the lock.
        lock.unlock();
        check(cudaSetDevice(lane_->device_), cat("cudaSetDevice(", lane_->device_, ")"));
        lane_->flags_->wait(static_cast<cudaStream_t>(stream), *flag);
        return StreamWait::kAwaited;
      }
    }
    if (lane_->options_.host_waits && ahead_of_marker) {
      // The GPU gets to the marker without this thread: the work before it is queued already,
      // and no stream waits for a copy that is not on a stream. The dispatcher, which polls
      // while the copy is scheduled, says when the marker passes.
      const auto start = std::chrono::steady_clock::now();
      lane_->progress_.wait(lock, [&] { return copy_->complete || copy_->marker <= lane_->passed_marker_; });
      lane_->activity_.host_waited_s +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (copy_->complete) return StreamWait::kDone;
    }
    const Flushed flushed = lane_->flush_for(*copy_, RestOfCopy::kQueue);
    wait_outside_lock(lock, flushed.wait_on, static_cast<cudaStream_t>(stream));
    return flushed.how;
  }
  std::size_t abandon(void* stream) override {
    std::unique_lock lock(lane_->mutex_);
    if (copy_->complete) return 0;
    const Flushed flushed = lane_->flush_for(*copy_, RestOfCopy::kDrop);
    wait_outside_lock(lock, flushed.wait_on, static_cast<cudaStream_t>(stream));
    return flushed.dropped;
  }

 private:
  using Flushed = CopyLane::Flushed;
  // Makes `stream` wait for the copy's event that flush_for pinned (none: nothing to wait for),
  // with the lock released meanwhile (see the flag's wait above), and unpins it.
  void wait_outside_lock(std::unique_lock<std::mutex>& lock, cudaEvent_t event, cudaStream_t stream) {
    if (event == nullptr) return;
    lock.unlock();
    const cudaError_t rc = cudaStreamWaitEvent(stream, event, 0);
    lock.lock();
    lane_->unpin(*copy_);
    check(rc, cat("cudaStreamWaitEvent(", copy_->what, ")"));
  }

  std::shared_ptr<CopyLane> lane_;
  std::shared_ptr<Copy> copy_;
};

CopyLane::CopyLane(int device, cudaMemcpyKind kind, std::shared_ptr<EventPool> events, Options options)
    : device_(device),
      kind_(kind),
      events_(std::move(events)),
      stream_(device),
      side_(device),
      options_(options),
      schedule_(options.chunk_bytes) {
  if (options_.device_waits) flags_.emplace(device);
  dispatcher_ = std::thread([this] {
    name_this_thread(kind_ == cudaMemcpyDeviceToHost ? "teraio-lane-d2h" : "teraio-lane-h2d");
    run();
  });
}

CopyLane::~CopyLane() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  dispatcher_.join();
  for (auto& [no, event] : markers_) events_->give_back(event);
  if (cudaSetDevice(device_) == cudaSuccess)
    warn_if_failed(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize(copy lane)");
}

std::unique_ptr<CopyEvent> CopyLane::copy(void* dst, const void* src, std::size_t n, CopyPriority priority,
                                          std::string what) {
  auto copy = std::make_shared<Copy>();
  copy->dst = static_cast<char*>(dst);
  copy->src = static_cast<const char*>(src);
  copy->what = std::move(what);
  {
    std::lock_guard lock(mutex_);
    account();  // an idle lane has work from here on
    copy->marker = last_marker_;
    copy->id = schedule_.add(n, priority);
    scheduled_.emplace(copy->id, copy);
  }
  work_.notify_one();
  return std::make_unique<Event>(shared_from_this(), std::move(copy));
}

void CopyLane::wait_for(cudaStream_t compute) {
  cudaEvent_t event = events_->take();
  try {
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    check(cudaEventRecord(event, compute), "cudaEventRecord(compute stream)");
  } catch (...) {
    events_->give_back(event);
    throw;
  }
  std::lock_guard lock(mutex_);
  markers_.emplace_back(++last_marker_, event);
}

CopyLane::Flushed CopyLane::flush_for(Copy& copy, RestOfCopy what_of_rest) {
  // Before the rest leaves the schedule: a rest taken out and never submitted would not complete.
  check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
  bool started = true;
  Flushed flushed{0, StreamWait::kQueued};
  if (auto rest = schedule_.take_rest(copy.id)) {
    flushed.how = StreamWait::kFlushed;
    if (what_of_rest == RestOfCopy::kDrop) {
      // An empty last chunk records the copy's event behind the chunks already queued, so that
      // it completes as any copy does; it reads nothing, so it need not wait for the marker.
      // (It would set an awaited copy's flag too, releasing its waiters without the bytes: only
      // copies out are abandoned, and only copies in are awaited.)
      started = rest->offset > 0;
      flushed.dropped = std::exchange(rest->bytes, 0);
      submit(*rest);
    } else if (copy.marker > passed_marker_) {
      // Its marker has not passed yet, so none of it is on the lane's stream: the side stream
      // waits for the marker and copies it, and the lane's stream goes on with the copies that
      // are ready (with options_.side_first, only until the marker passes). Markers not yet passed are
      // numbered passed_marker_ + 1, + 2, ... in markers_.
      // Queued under the lock, unlike a compute stream's waits: the side stream's launch queue
      // fills only behind ~1 000 gated copies, which a device-waits lane gates only between
      // planned steps or with every flag in use.
      const cudaEvent_t marker = markers_.at(copy.marker - passed_marker_ - 1).second;
      check(cudaStreamWaitEvent(side_.get(), marker, 0),
            cat("cudaStreamWaitEvent(marker for ", copy.what, ")"));
      ++activity_.gated_flushes;
      activity_.gated_bytes += rest->bytes;
      submit_rest(*rest, side_.get(), side_queued_, copy.marker);
      flushed.how = StreamWait::kGated;
    } else {
      submit_rest(*rest, stream_.get(), queued_, 0);
    }
  }
  if (started && copy.done != nullptr) {
    // Kept from the pool until the caller's wait is queued (unpin): a record of another copy
    // would be what the stream waited for.
    flushed.wait_on = copy.done;
    ++copy.pins;
  }
  return flushed;
}

void CopyLane::unpin(Copy& copy) {
  // Complete meanwhile: retire_finished left its event to the last pin.
  if (--copy.pins == 0 && copy.complete) events_->give_back(std::exchange(copy.done, nullptr));
}

std::optional<StreamFlags::Flag> CopyLane::await(const std::shared_ptr<Copy>& copy) {
  if (!copy->flag) {
    // Its rest is on a stream already (gated while no plan was served, or while every flag was
    // in use): only its event can serve, as no setting of a flag would follow it.
    if (!scheduled_.contains(copy->id)) return std::nullopt;
    // Every flag in use (thousands of copies awaited and not done): this one is gated instead,
    // and counted so (gated_flushes).
    copy->flag = flags_->take();
    if (!copy->flag) return std::nullopt;
    awaited_.push_back(copy);
    ++activity_.awaited;
    activity_.awaited_bytes += schedule_.remaining(copy->id);
  }
  return copy->flag;
}

void CopyLane::submit_awaited() {
  std::erase_if(awaited_, [&](const std::shared_ptr<Copy>& copy) {
    if (copy->marker > passed_marker_) return false;
    // Taken already where another stream waited for it after the marker passed (flush_for).
    if (auto rest = schedule_.take_rest(copy->id)) submit_rest(*rest, stream_.get(), queued_, 0);
    return true;
  });
}

void CopyLane::retire_finished(std::deque<Queued>& queued) {
  while (!queued.empty()) {
    const cudaError_t rc = cudaEventQuery(queued.front().event);
    if (rc == cudaErrorNotReady) return;
    Queued done = std::move(queued.front());
    queued.pop_front();
    // A thread about to make a stream wait for this event (flush_for's caller) keeps it, as
    // the copy's `done`, until its unpin.
    const bool pinned = done.last_of && done.last_of->pins > 0;
    if (!pinned) events_->give_back(done.event);
    if (!done.last_of) continue;
    Copy& copy = *done.last_of;
    if (rc != cudaSuccess && !copy.error) {
      cudaGetLastError();
      copy.error = std::make_exception_ptr(
          Error(ErrorKind::kCuda, cat(copy.what, ": ", cudaGetErrorName(rc), ": ", cudaGetErrorString(rc))));
    }
    copy.complete = true;
    if (!pinned) copy.done = nullptr;
    // Set behind the copy's last chunk, before its event: the flag's setting has run too.
    if (copy.flag) flags_->give_back(*std::exchange(copy.flag, std::nullopt));
    progress_.notify_all();
  }
}

void CopyLane::advance_markers() {
  // Markers pass in stream order: the first one not passed holds back all later ones.
  while (!markers_.empty()) {
    const cudaError_t rc = cudaEventQuery(markers_.front().second);
    if (rc == cudaErrorNotReady) return;
    cudaGetLastError();  // a failed compute stream is reported by its own kernels
    passed_marker_ = markers_.front().first;
    events_->give_back(markers_.front().second);
    markers_.pop_front();
    progress_.notify_all();  // a thread may wait for this marker (Options::host_waits)
  }
}

void CopyLane::submit(const CopySchedule::Chunk& chunk, cudaStream_t stream, std::deque<Queued>& queued) {
  std::shared_ptr<Copy> copy = scheduled_.at(chunk.id);
  if (chunk.last) scheduled_.erase(chunk.id);
  Queued entry{events_->take(), chunk.last ? copy : nullptr};
  try {
    if (chunk.bytes > 0)
      check(cudaMemcpyAsync(copy->dst + chunk.offset, copy->src + chunk.offset, chunk.bytes, kind_, stream),
            cat("cudaMemcpyAsync(", copy->what, ")"));
  } catch (...) {
    copy->error = std::current_exception();
  }
  if (chunk.last && copy->flag) {
    // A stream waits on the flag (await): it is set even if the copy failed, whose error its
    // event's waiters see, so that the GPU does not wait forever.
    try {
      flags_->set(stream, *copy->flag);
    } catch (...) {
      if (!copy->error) copy->error = std::current_exception();
    }
  }
  if (chunk.last) copy->done = entry.event;
  // The state so far ends here: a chunk from flush_for (another thread) makes the lane busy.
  account();
  ++activity_.chunks;
  activity_.bytes += chunk.bytes;
  const cudaError_t rc = cudaEventRecord(entry.event, stream);
  if (rc != cudaSuccess && !copy->error) {
    cudaGetLastError();
    copy->error = std::make_exception_ptr(Error(ErrorKind::kCuda, cat("cudaEventRecord(", copy->what, ")")));
  }
  queued.push_back(std::move(entry));
}

void CopyLane::submit_rest(const CopySchedule::Chunk& rest, cudaStream_t stream, std::deque<Queued>& queued,
                           std::uint64_t marker) {
  std::size_t offset = rest.offset;
  const std::size_t end = rest.offset + rest.bytes;
  do {
    const std::size_t piece =
        options_.chunked_rests ? std::min(options_.chunk_bytes, end - offset) : end - offset;
    submit(CopySchedule::Chunk{rest.id, offset, piece, offset + piece == end && rest.last}, stream, queued);
    queued.back().marker = marker;
    offset += piece;
  } while (offset < end);
}

void CopyLane::account() {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - marked_).count();
  marked_ = now;
  // The side stream moves data once the marker its front copy waits for has passed.
  if (held_ > 0 && !schedule_.empty()) activity_.held_for_driver_s += s;
  if (!queued_.empty() || side_moving()) {
    activity_.busy_s += s;
    if (holding_) activity_.held_s += s;
  } else if (!schedule_.empty() || !side_queued_.empty()) {
    activity_.waiting_s += s;
  } else {
    activity_.idle_s += s;
  }
}

void CopyLane::serve_plan(bool planned) {
  std::lock_guard lock(mutex_);
  serving_plan_ = planned;
}

void CopyLane::hold() {
  std::lock_guard lock(mutex_);
  account();
  ++held_;
  ++activity_.holds;
}

void CopyLane::release() noexcept {
  {
    std::lock_guard lock(mutex_);
    account();
    --held_;
  }
  work_.notify_one();
}

bool CopyLane::wait_idle(std::chrono::steady_clock::time_point until) {
  std::unique_lock lock(mutex_);
  // While chunks are queued or the side stream holds copies the dispatcher looks every few
  // microseconds, and it sleeps only once both are empty: the condition is seen either way.
  return quiet_.wait_until(lock, until, [&] { return queued_.empty() && !side_moving(); });
}

LinkActivity CopyLane::take_activity() {
  std::lock_guard lock(mutex_);
  account();
  return std::exchange(activity_, LinkActivity{});
}

void CopyLane::run() {
  if (cudaSetDevice(device_) != cudaSuccess) log::warn("copy lane: cudaSetDevice(", device_, ") failed");
  // The loop below looks every few microseconds only with a small timer slack (core/timer_slack).
  slack_.start();
  const auto ready = [this](CopySchedule::Id id) { return scheduled_.at(id)->marker <= passed_marker_; };
  std::unique_lock lock(mutex_);
  for (;;) {
    // The state held since the last mark ends as the dispatcher looks again.
    account();
    retire_finished();
    advance_markers();
    if (!awaited_.empty()) submit_awaited();
    if (held_ > 0 && queued_.empty() && !side_moving()) quiet_.notify_all();
    holding_ = false;
    if (queued_.size() < kWindow && held_ == 0) {
      if (options_.side_first && side_moving()) {
        holding_ = schedule_.has_ready(ready);
      } else if (const auto chunk = schedule_.next(ready)) {
        submit(*chunk);
        continue;
      }
    }
    if (schedule_.empty() && queued_.empty() && side_queued_.empty()) {
      if (stopping_) return;
      work_.wait(lock);
      continue;
    }
    // Chunks run or copies wait for the compute stream: look again shortly. A chunk takes
    // 20 us (1 MiB, the smallest) to 160 us (8 MiB, the default) at 50 GB/s, so polling every
    // few microseconds (~10 us with the slack set in run(), BM_PollingPause) keeps the link busy
    // at little cost.
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(5));
    lock.lock();
  }
}

}  // namespace teraio::io::cuda_detail
