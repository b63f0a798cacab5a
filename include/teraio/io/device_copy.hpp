// io/device_copy: asynchronous copies between "device memory" and host memory, with
// completion events. Two implementations: CUDA (a dedicated stream per direction,
// cudaMemcpyAsync, events) and host (for CPU-only machines, where device memory is ordinary
// memory: this is how CPU training is expanded with SSDs and how CI tests the whole engine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/io/copy_schedule.hpp"

namespace teraio::io {

// Where a buffer handed to the engine lives.
enum class MemoryKind { kHost, kDevice };

// Which of the copier's two streams.
enum class CopyDirection { kToHost, kToDevice };

// In what order the CUDA copier runs one direction's copies: as issued (each straight onto the
// stream), or by CopyPriority (CopySchedule: urgent, then earliest deadline), fed to the stream
// in chunks by a dispatcher thread, as the planner and the simulator assume. In deadline order a
// copy that a stream already waits for while its compute marker has not passed moves on a side
// stream (StreamWait::kGated), and the lane goes on beside it: the two streams share the link,
// and the lane's stream may take most of it (a 256 MiB copy waited for ended 49 ms after its
// marker beside a 4 GiB one on the lane, 5 ms alone; bench/RESULTS.md session 38). Such a copy
// is more pressing than any still scheduled (those are waited for later, or they would have
// been flushed too), so kDeadlineAlone holds the lane's next chunks back while it moves and it
// has the link to itself, as in the simulator. Not the default: on W3 it ran no faster.
// kDeadlineChunked is kDeadline with the rest of a copy waited for (flushed or gated) queued in
// chunks too, not as one cudaMemcpyAsync: on W3, single 16 MiB copies that the simulation lands
// 10-41 ms ahead waited 15-43 ms beside 224-512 MiB copies moved as one piece each (bench/
// RESULTS.md session 39); a stream's long copy may keep the other stream's off the link. The
// chunks do not change that: its copier test timed a gated 256 MiB copy beside a busy lane at
// 44 ms, as unchunked (session 40). kDeadlineHostWaits gates no copy while the copier serves a
// plan (DeviceCopier::serve_plan): a thread that must make a stream wait for a copy whose
// marker the GPU has not passed waits on the host until it has, and the copy's rest then goes
// on the lane's stream ahead of the lane's other chunks, as the simulator serves a copy waited
// for. On W3, 333 of the 428 GiB a step brought to the device went as one-piece rests of copies
// waited for (215 GiB gated onto the side stream, 118 GiB flushed), outside the deadline order
// (session 39). The host's lead over the GPU is then at most the copy's prefetch distance. On
// W3 it cut the copy-in waits by a quarter or more, but the copy-out waits grew and the host
// waited 3.2-3.6 s a step for markers, a third of it for copies out (session 40).
// kDeadlineHostWaitsIn keeps the host's waits to copies into the device, where the deadline
// order is what the plan counts on, and gates copies out as kDeadline does: a copy out waited
// for is for room, and its bytes go to the host. On W3 both host-waits orders ran 1.1% faster
// than kDeadline on one H200 (bench/RESULTS.md session 41). But the host waits so 3.6-3.9 s a
// step on W3 (session 45), and each wait leaves the GPU only the work queued before the host
// woke: kDeadlineDeviceWaitsIn serves copies into the device waited for before their marker as
// kDeadlineHostWaitsIn does, their rests on the lane's stream once the marker passes, ahead of
// the lane's other chunks, but the compute stream, not the host, waits for them: on a flag in
// device memory (io/stream_flags_cuda) that the lane sets behind the rest, queued by the
// dispatcher. The host goes on; its lead is bounded by memory only. Copies out are gated as in
// kDeadline. The GPU then goes on only once the dispatcher has queued the rest: a thread that
// makes the device wait for all streams (cudaDeviceSynchronize, cudaFree) while such a copy is
// pending waits for the dispatcher's calls, which must get through meanwhile (the CUDA copier
// test ADeviceWaitForACopyNotYetQueuedLetsADeviceSynchronizationEnd).
enum class CopyOrder {
  kIssue,
  kDeadline,
  kDeadlineAlone,
  kDeadlineChunked,
  kDeadlineHostWaits,
  kDeadlineHostWaitsIn,
  kDeadlineDeviceWaitsIn
};
std::string_view to_string(CopyOrder order);
// "issue", "deadline", "deadline-alone", "deadline-chunked", "deadline-host-waits",
// "deadline-host-waits-in" or "deadline-device-waits-in"; throws Error{kInvalidArgument} for
// anything else.
CopyOrder parse_copy_order(std::string_view text);

// The piece a deadline-order lane queues at a time (about 160 µs at 50 GB/s): a more urgent copy
// overtakes within one piece. A choice (make_cuda_copier) because the paged allocator's mappings
// cost 4-6 times more under W3's copies than idle (session 42), which the piece's length may set.
inline constexpr std::size_t kDefaultLaneChunkBytes = std::size_t{8} << 20;
// A piece under 1 MiB (20 µs at 50 GB/s) would leave the window of two pieces shorter than the
// dispatcher's look every ~10 µs, and the link idle between looks.
inline constexpr std::size_t kSmallestLaneChunkBytes = std::size_t{1} << 20;
inline constexpr std::size_t kLargestLaneChunkBytes = std::size_t{256} << 20;
// Returns `bytes` if a lane may use it (a multiple of 4 KiB from kSmallestLaneChunkBytes to
// kLargestLaneChunkBytes); throws Error{kInvalidArgument} otherwise.
std::size_t checked_lane_chunk(std::size_t bytes);

// Where a copy stood when a stream was made to wait for it (CopyEvent::block_stream): done
// (nothing to wait for; the host copier's copies always are), all of it already on a stream,
// its rest queued on the lane's stream then (its compute marker had passed), or its rest queued
// on the side stream behind a device-side wait for its marker (deadline order; the side stream
// runs its copies in the order they come). Which it was tells a late copy's cause apart: a link
// behind its plan, or a copy issued before the GPU reached the point it may start at (W3's
// 16 KiB prefetches waited 20-30 ms each, bench/RESULTS.md session 37). Awaited: none of it
// queued, its marker not passed, the stream made to wait on a flag the lane sets once the rest
// it queues later is done (CopyOrder::kDeadlineDeviceWaitsIn).
enum class StreamWait : std::uint8_t { kDone, kQueued, kFlushed, kGated, kAwaited };
// "done", "queued", "flushed", "gated" or "awaited".
std::string_view to_string(StreamWait how);

// Completion of one asynchronous copy. wait() rethrows a copy failure as teraio::Error.
class CopyEvent {
 public:
  virtual ~CopyEvent() = default;
  virtual bool ready() = 0;
  virtual void wait() = 0;
  // Makes the work queued on `stream` (a cudaStream_t) after this call wait for the copy, on
  // the device: the host does not block, so the GPU's queue of launched kernels is not drained.
  // The host copier has no streams and its copies have completed already: nothing to do.
  // Returns where the copy stood then.
  virtual StreamWait block_stream(void* stream) = 0;
  // The copy's result is no longer wanted, but its source memory stays in use (an offload
  // taken back while it runs): drops the bytes it has not started where the copier can, and
  // makes the work queued on `stream` after this call wait, on the device, for the bytes it
  // has, so that the source is not freed or written under them. The event still completes
  // (the destination then holds part of the bytes). Returns the bytes it will not copy. By
  // default the whole copy is waited for.
  virtual std::size_t abandon(void* stream) {
    block_stream(stream);
    return 0;
  }
};

// What one direction's link did, as the CUDA copier's dispatcher saw it (deadline order only):
// why a plan's copies can end later than the planner assumed. Host clock, polled every few
// microseconds, so each state's time is good to about one polling interval per change.
struct LinkActivity {
  double busy_s = 0;     // chunks on the lane's stream, or a side copy past its marker (below)
  double waiting_s = 0;  // otherwise copies waiting for the compute stream (their markers)
  double idle_s = 0;     // nothing to copy
  std::uint64_t chunks = 0;
  std::uint64_t bytes = 0;  // put on the stream
  // Copies something had to wait for before the compute stream reached their marker, and their
  // bytes: each went onto a side stream behind a device-side wait for that marker, so that the
  // lane's stream goes on with the copies that are ready (in deadline-alone order only until the
  // marker passes).
  std::uint64_t gated_flushes = 0;
  std::uint64_t gated_bytes = 0;
  // Of busy_s: the time the lane held a ready chunk back because a copy waited for moved on
  // the side stream (CopyOrder::kDeadlineAlone; always 0 in kDeadline).
  double held_s = 0;
  // Host time threads waited for the GPU to pass a copy's marker before queuing its rest
  // (CopyOrder::kDeadlineHostWaits, and kDeadlineHostWaitsIn to the device, while serving a
  // plan: DeviceCopier::serve_plan; 0 otherwise).
  double host_waited_s = 0;
  // Copies a stream waited for on a flag before their marker passed, and their bytes
  // (CopyOrder::kDeadlineDeviceWaitsIn to the device, while serving a plan; 0 otherwise): each
  // counted once, however many streams waited.
  std::uint64_t awaited = 0;
  std::uint64_t awaited_bytes = 0;
  // Holds (DeviceCopier::hold_copies) and, of the time above, the time one was on while copies
  // were scheduled (queued on no stream yet).
  std::uint64_t holds = 0;
  double held_for_driver_s = 0;
};
struct LinkActivities {
  LinkActivity to_host;
  LinkActivity to_device;
};

// Which of the copier's copies a hold stops (DeviceCopier::hold_copies): both directions', or
// only those to the host. Why the choice: on an H200 setting access to a 16 MiB page cost
// 1 058 µs beside copies out of the device alone and 50 µs beside copies into it alone (34.5 µs
// idle; bench/vmm_costs.py --copy-ways, bench/RESULTS.md session 44), so holding the copies out
// leaves the prefetches, which the GPU waits for, on the link.
enum class HeldCopies { kBothWays, kToHost };
// "both" or "to-host".
std::string_view to_string(HeldCopies held);
// "both" or "to-host"; throws Error{kInvalidArgument} for anything else.
HeldCopies parse_held_copies(std::string_view text);

// While it lives, the copier queues no copy of the held directions onto the link
// (DeviceCopier::hold_copies). Why: CUDA's mapping calls wait for the copy engines, page by
// page. On an H200 setting access to a 16 MiB page cost 0.5-1.1 ms while copies ran both ways
// and 37 µs with them held and drained first (bench/vmm_costs.py, bench/RESULTS.md session 43);
// W3's paged allocator paid 140-210 µs a page mapped beside TeraIO's copies.
class CopyHold {
 public:
  virtual ~CopyHold() = default;
  // Whether all that the held directions had on the link finished before the wait ran out.
  virtual bool quiet() const = 0;
};

// How long hold_copies waits for the copies on the link to finish: a window of 8 MiB pieces a
// direction takes ~0.3 ms, a rest flushed in one piece up to ~40 ms (2 GiB at 50 GB/s). Past
// this the hold stays on and the driver's calls pay for what still moves.
inline constexpr double kCopyHoldWaitSeconds = 0.020;

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // "host" or "cuda:N": reported by the engine, never guessed.
  virtual std::string name() const = 0;
  virtual bool is_cuda() const = 0;
  // The order its copies run in, in words ("issue order", "deadline order (8.0 MiB chunks; copies
  // waited for sharing the link; dispatchers poll with 1 us timer slack)", "deadline-alone order
  // (...)", "deadline-chunked order (...; copies waited for sharing the link, their rests in
  // chunks too; ...)").
  virtual std::string order() const { return "issue order"; }
  // Whether copies of one direction complete in the order they were issued (so that waiting
  // for them in that order loses no time).
  virtual bool completes_in_order() const { return true; }
  // Starts a copy; the event completes when all n bytes have arrived. Host buffers should be
  // pinned (see pin()) for full speed on CUDA. The priority matters in deadline order only.
  virtual std::unique_ptr<CopyEvent> to_host(void* host_dst, const void* device_src, std::size_t n,
                                             CopyPriority priority = {}) = 0;
  virtual std::unique_ptr<CopyEvent> to_device(void* device_dst, const void* host_src, std::size_t n,
                                               CopyPriority priority = {}) = 0;
  // The NUMA node nearest the device (its PCIe root), where the kernel knows it: pinned host
  // memory prefers it (io/numa). nullopt for the host copier.
  virtual std::optional<int> numa_node() const { return std::nullopt; }
  // Page-locks host memory for DMA (cudaHostRegister); no-op for the host copier.
  virtual void pin(void* host, std::size_t n) = 0;
  virtual void unpin(void* host) = 0;
  // Later copies in `direction` start only after the work queued so far on compute_stream (a
  // cudaStream_t; nullptr is the legacy default stream) has finished: how a copy out of a tensor
  // is ordered after the kernels that produce it, and a copy into a fresh allocation after the
  // kernels that last used its block. Only that direction waits: a prefetch must not queue
  // behind the compute that an offload waits for. Nothing to order on the host copier.
  virtual void wait_for_stream(void* compute_stream, CopyDirection direction) {
    static_cast<void>(compute_stream);
    static_cast<void>(direction);
  }
  // Whether the copier serves a plan from here on (true until told otherwise): read when a
  // stream is made to wait for a copy (CopyEvent::block_stream). The host-waits orders wait on
  // the host only while it does, and gate the copy as kDeadline does otherwise: without a plan
  // there is no deadline order to keep, and a host wait only lets the GPU's queue run down.
  // Host waits in a profiling step made its operator times take in the host's time instead of
  // the kernels' (on W3 2.1 s a step more, bench/RESULTS.md session 40).
  virtual void serve_plan(bool planned) { static_cast<void>(planned); }
  // Each direction's activity since the last call (or since the copier was made), and starts
  // counting again; nothing where copies go straight onto a stream (issue order, host copier).
  virtual std::optional<LinkActivities> take_link_activity() { return std::nullopt; }
  // Holds copies not yet on the link back (both directions, or those to the host only) and
  // waits, up to kCopyHoldWaitSeconds, until those of the held directions on it have finished:
  // for the paged allocator's driver calls (io/paged_device_memory). Copies a stream waits for
  // still go on (their rests are queued by the waiting thread, and a device-side wait must not
  // hang on a hold). nullptr where the copier cannot hold its copies: issue order puts each
  // straight onto a stream, and the host copier has no link.
  virtual std::unique_ptr<CopyHold> hold_copies(HeldCopies held) {
    static_cast<void>(held);
    return nullptr;
  }
  // Device memory for tests and benchmarks (cudaMalloc / aligned host memory).
  virtual void* allocate_device(std::size_t n) = 0;
  virtual void free_device(void* device) = 0;
};

std::unique_ptr<DeviceCopier> make_host_copier();
// Throws Error{kUnsupported} in a build without CUDA, Error{kCuda} when the device is absent.
// `chunk_bytes` (checked_lane_chunk) is the deadline-order lanes' piece; issue order ignores it.
std::unique_ptr<DeviceCopier> make_cuda_copier(int device, CopyOrder order = CopyOrder::kDeadline,
                                               std::size_t chunk_bytes = kDefaultLaneChunkBytes);
bool cuda_compiled_in();

// What the CUDA runtime sees, for `teraio doctor` and test skips: one line per device
// ("0: NVIDIA H100 80GB HBM3, 79.1 GiB, compute 9.0") and, when there is none, why. Never throws.
struct CudaInventory {
  std::vector<std::string> devices;
  std::string detail;  // runtime/driver versions, or the reason no device is usable
};
CudaInventory cuda_inventory();

}  // namespace teraio::io
