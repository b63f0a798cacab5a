// io/copy_lane_cuda: one direction of the CUDA copier in deadline order. Copies wait in a
// CopySchedule; a dispatcher thread feeds the stream one chunk at a time, most pressing copy
// first, with at most kWindow chunks queued so that a more pressing copy overtakes within a
// chunk or two. A stream that must wait for a copy still scheduled (block_stream) queues the
// rest of it right away, from the waiting thread, and waits on its event: a device-side wait
// never depends on the dispatcher, which could be stuck behind a device-wide synchronization
// (cudaFree) that itself waits for that stream. A copy so queued before the compute stream has
// reached its marker goes onto a side stream that waits for the marker on the device: on the
// lane's own stream that wait would hold up every chunk behind it until the GPU caught up with
// the host (session 30 measured W3's lanes moving 15-40 GB/s while busy against the link's
// 37-50 GB/s). A copy on the side stream is waited for already, so it is more pressing than any
// copy still scheduled: with side_first (CopyOrder::kDeadlineAlone) the dispatcher queues no
// chunk while one moves there, which gives it the whole link; beside the lane's chunks it may
// get little of it (a copier test: 49 ms against 5 ms). On W3 that hold changed neither the
// device waits nor the step (bench/RESULTS.md session 38), so it is not the default. With
// device_waits (CopyOrder::kDeadlineDeviceWaitsIn) a stream waiting for a copy before its marker
// passed waits on a flag instead (io/stream_flags_cuda), which the lane sets behind the copy's
// rest, queued by the dispatcher once the marker passes: then the device wait does depend on
// the dispatcher.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_support.hpp"
#include "stream_flags_cuda.hpp"
#include "teraio/core/timer_slack.hpp"
#include "teraio/io/copy_schedule.hpp"
#include "teraio/io/device_copy.hpp"

namespace teraio::io::cuda_detail {

class CopyLane : public std::enable_shared_from_this<CopyLane> {
 public:
  static constexpr std::size_t kWindow = 2;  // chunks queued on the stream at once

  // How copies waited for are served (CopyOrder): the lane held while one moves on the side
  // stream (kDeadlineAlone), rests queued in chunks (kDeadlineChunked), or the host waiting for
  // the copy's marker instead of gating it onto the side stream (kDeadlineHostWaits, and the
  // lane to the device in kDeadlineHostWaitsIn), or the stream waiting for it on a flag (the
  // lane to the device in kDeadlineDeviceWaitsIn).
  struct Options {
    bool side_first = false;
    bool chunked_rests = false;
    bool host_waits = false;
    bool device_waits = false;
    std::size_t chunk_bytes = kDefaultLaneChunkBytes;  // checked by make_cuda_copier
  };
  CopyLane(int device, cudaMemcpyKind kind, std::shared_ptr<EventPool> events, Options options);
  // Runs every copy still scheduled (its compute-stream waits pass as the device works), then
  // stops the dispatcher and drains the stream.
  ~CopyLane();
  CopyLane(const CopyLane&) = delete;
  CopyLane& operator=(const CopyLane&) = delete;

  std::unique_ptr<CopyEvent> copy(void* dst, const void* src, std::size_t n, CopyPriority priority,
                                  std::string what);
  // Copies scheduled after this call start only after the work queued so far on `compute`.
  void wait_for(cudaStream_t compute);
  // What the lane did since the last call (DeviceCopier::take_link_activity).
  LinkActivity take_activity();
  // DeviceCopier::serve_plan: with options_.host_waits, the host waits for markers only then
  // (and with options_.device_waits a stream waits on a flag only then).
  void serve_plan(bool planned);
  // DeviceCopier::hold_copies: while held (holds nest), the dispatcher queues no chunk; rests
  // flushed for a stream waiting still go on. wait_idle returns true once nothing of the lane's
  // moves on the link (its stream's chunks done, the side stream not moving), false at `until`.
  // The dispatcher sees that and says so: the waiting thread (PyTorch's, in the allocator) makes
  // no CUDA call here, and so cannot clear an error its own launches left for it to check.
  void hold();
  void release() noexcept;
  bool wait_idle(std::chrono::steady_clock::time_point until);
  // The dispatcher's timer slack as it read it back (core/timer_slack).
  const PollingSlack& polling_slack() const { return slack_; }

 private:
  struct Copy {
    CopySchedule::Id id = 0;
    char* dst = nullptr;
    const char* src = nullptr;
    std::uint64_t marker = 0;  // the compute-stream marker it waits for (0: none)
    // Recorded after its last chunk; the pool's again once complete and no longer pinned.
    cudaEvent_t done = nullptr;
    std::optional<StreamFlags::Flag> flag;  // set behind its last chunk: a stream waits on it (await)
    int pins = 0;                           // threads about to make a stream wait for `done` (flush_for)
    bool complete = false;
    std::exception_ptr error;
    std::string what;
  };
  struct Queued {
    cudaEvent_t event = nullptr;
    std::shared_ptr<Copy> last_of;  // set on a copy's final chunk
    std::uint64_t marker = 0;       // on the side stream: the compute marker it waits for
  };
  class Event;

  void run();
  // Adds the time since the last mark to the state the lane was in (under the lock).
  void account();
  void retire_finished() {
    retire_finished(queued_);
    retire_finished(side_queued_);
  }
  void advance_markers();
  // A copy on the side stream is moving: its marker has passed (under the lock).
  bool side_moving() const { return !side_queued_.empty() && side_queued_.front().marker <= passed_marker_; }
  // Queues a chunk on `stream` and its event on `queued` (the lane's own or the side's).
  void submit(const CopySchedule::Chunk& chunk, cudaStream_t stream, std::deque<Queued>& queued);
  void submit(const CopySchedule::Chunk& chunk) { submit(chunk, stream_.get(), queued_); }
  // Queues the rest of a copy waited for (flush_for) on `stream`: as one piece, or in chunks of
  // options_.chunk_bytes with options_.chunked_rests; each piece on the side stream keeps the copy's marker.
  void submit_rest(const CopySchedule::Chunk& rest, cudaStream_t stream, std::deque<Queued>& queued,
                   std::uint64_t marker);
  // Retires the completed front of one queue (each completes in its stream's order).
  void retire_finished(std::deque<Queued>& queued);
  // What flush_for does with the chunks of a copy not yet queued: queue them now (behind the
  // copy's marker), or drop them (CopyEvent::abandon).
  enum class RestOfCopy { kQueue, kDrop };
  // Takes the rest of a copy off the schedule (under the lock) and returns the event that a
  // stream waiting for the copy must wait for, what of the copy is on the lane's or the side stream then
  // (none when its rest was dropped whole), pinned: the caller queues that wait outside the lock, then unpins
  // it, so that the event is not retired and reused meanwhile. Also the bytes dropped and where the copy
  // stood: all of it queued already, its rest flushed onto the lane's stream, or onto the side stream
  // (gated).
  struct Flushed {
    std::size_t dropped = 0;
    StreamWait how = StreamWait::kQueued;
    cudaEvent_t wait_on = nullptr;
  };
  Flushed flush_for(Copy& copy, RestOfCopy what_of_rest);
  void unpin(Copy& copy);
  // The flag a stream is to wait on for a copy none of which is queued, its marker not passed
  // (taken now if it has none); the dispatcher queues its rest once the marker has passed
  // (submit_awaited). None where its rest is on a stream already, or every flag is in use.
  // Under the lock; the caller queues the wait outside it.
  std::optional<StreamFlags::Flag> await(const std::shared_ptr<Copy>& copy);
  // The dispatcher: the rests of copies awaited whose markers have passed go on the lane's
  // stream now, each in one piece, ahead of its other chunks, as a host-waits order's waiting
  // thread would queue them (and while the lane is held, as such a thread's would).
  void submit_awaited();

  int device_;
  cudaMemcpyKind kind_;
  std::shared_ptr<EventPool> events_;
  Stream stream_;
  Stream side_;  // copies waited for before their compute marker passed (flush_for)
  const Options options_;

  std::mutex mutex_;
  std::condition_variable work_;      // the dispatcher: a copy arrived or the lane stops
  std::condition_variable progress_;  // waiters: a copy completed
  std::condition_variable quiet_;     // wait_idle: held, and nothing of the lane's on the link
  CopySchedule schedule_;
  std::unordered_map<CopySchedule::Id, std::shared_ptr<Copy>> scheduled_;
  std::deque<Queued> queued_;
  std::deque<Queued> side_queued_;                             // on side_: outside the window
  std::deque<std::pair<std::uint64_t, cudaEvent_t>> markers_;  // recorded, not yet seen passed
  std::optional<StreamFlags> flags_;                           // with options_.device_waits
  std::vector<std::shared_ptr<Copy>> awaited_;                 // awaited, their rests not yet queued
  std::uint64_t last_marker_ = 0;
  std::uint64_t passed_marker_ = 0;
  bool stopping_ = false;
  bool holding_ = false;  // the dispatcher's last look held a ready chunk back (options_.side_first)
  bool serving_plan_ = true;
  int held_ = 0;  // hold() calls not yet released
  LinkActivity activity_;
  std::chrono::steady_clock::time_point marked_ = std::chrono::steady_clock::now();
  PollingSlack slack_;
  std::thread dispatcher_;
};

}  // namespace teraio::io::cuda_detail
