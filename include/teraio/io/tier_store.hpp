// io/tier_store: the storage engine's front door. Holds a pinned host tier of hard capacity
// and an SSD tier striped over N paths (one preallocated swap file each, served by cuFile,
// io_uring or POSIX threads, chosen per file and reported). Callers allocate extents on a
// tier and submit asynchronous writes (device or host memory -> extent) and reads (extent ->
// device or host memory); each returns a Transfer to wait on or poll. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "teraio/core/timer_slack.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/host_tier.hpp"
#include "teraio/io/io_backend.hpp"
#include "teraio/io/pinned_pool.hpp"
#include "teraio/io/stripe_set.hpp"
#include "teraio/io/transfer.hpp"

namespace teraio::io {

enum class TierKind { kHost, kSsd };
std::string_view to_string(TierKind tier);

enum class BackendChoice { kAuto, kIoUring, kPosix };
std::string_view to_string(BackendChoice choice);
// "auto", "io_uring" (or "uring"), "posix"; Error{kInvalidArgument} otherwise.
BackendChoice parse_backend_choice(std::string_view text);

struct SsdPath;
struct SsdPipeline;

struct EngineConfig {
  std::uint64_t host_capacity = 0;      // bytes of pinned host tier; 0: no host tier
  bool pin_host_in_background = false;  // pin the host arena on a thread (transfers wait for it)
  std::vector<std::string> ssd_paths;   // directories, "{rank}" substituted; empty: no SSD tier
  std::uint64_t ssd_capacity_per_path = 0;
  std::uint64_t stripe_unit = 4 * kMiB;  // multiple of 4 KiB
  BackendChoice backend = BackendChoice::kAuto;
  unsigned io_threads = 4;               // POSIX backend threads per path
  unsigned queue_depth = 32;             // io_uring entries per path
  unsigned transfer_threads = 4;         // transfers carried out concurrently
  unsigned chunks_in_flight = 8;         // per transfer
  std::uint64_t chunk_bytes = 4 * kMiB;  // bounce buffer size, multiple of 4 KiB
  std::uint64_t bounce_pool_bytes = 64 * kMiB;
  bool checksums = false;          // XXH3 per extent, verified on read
  bool use_cufile = true;          // try GPUDirect Storage for device memory (CUDA copier only)
  bool unlink_swap_files = false;  // unlink right after open (space freed at exit)
  bool direct_io = true;           // O_DIRECT where the filesystem allows it
  // Host-tier transfers of device memory enqueue their copy on the submitting thread, so that
  // the transfer has a device-side event (Transfer::device_side) the caller's stream can wait
  // on. nullopt: when the copier is CUDA (on the host copier the copy would run synchronously
  // on the submitting thread; tests turn it on there). Never with checksums (the hash needs the
  // bytes on the host first).
  std::optional<bool> enqueue_host_copies;
  int rank = 0;
  // Test seam: wraps the backend of each path (fault injection). Empty: none.
  std::function<std::unique_ptr<IoBackend>(std::unique_ptr<IoBackend> real, const std::string& path)>
      wrap_backend;
};

// An allocated range on a tier. Plain value; the store keeps the placement behind id.
struct Extent {
  TierKind tier = TierKind::kHost;
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
};

// Where part of an extent lives: for the host tier, path is "host" and file_offset the arena offset.
struct ExtentPlacement {
  std::string path;
  std::uint64_t file_offset = 0;
  std::uint64_t logical_offset = 0;
  std::uint64_t length = 0;
};

struct PathReport {
  std::string path;     // the swap file
  std::string backend;  // "io_uring", "posix", or a wrapper's name
  bool direct_io = false;
  std::string buffered_reason;
  bool buffers_registered = false;
  bool cufile_active = false;
  std::string cufile_detail;  // why not, or what
  std::uint64_t capacity = 0;
  std::uint64_t used = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t bytes_read = 0;
};

struct TierStoreReport {
  std::string copier;
  std::string copy_order;  // DeviceCopier::order(): what actually runs
  std::uint64_t host_capacity = 0;
  std::uint64_t host_used = 0;
  std::uint64_t host_bytes_written = 0;
  std::uint64_t host_bytes_read = 0;
  std::string host_numa;       // HostTier::numa(): the node its pages prefer and where they are
  bool watchers_poll = false;  // copies complete out of order: the watchers poll for them
  std::string watcher_slack;   // PollingSlack::describe() of the watchers
  std::uint64_t stripe_unit = 0;
  std::uint64_t chunk_bytes = 0;
  bool checksums = false;
  std::vector<PathReport> paths;
};
// Multi-line, human-readable.
std::string format_report(const TierStoreReport& report);

class TierStore {
 public:
  // Opens and preallocates the swap files and maps the host tier. Throws Error naming the path
  // (kIo: missing or unwritable; kNoSpace: preallocation does not fit) or kInvalidArgument.
  TierStore(DeviceCopier& copier, EngineConfig config);
  // shutdown(), then releases everything.
  ~TierStore();
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  // nullopt when the tier has no room ("tier full"); never exceeds a capacity.
  std::optional<Extent> allocate(TierKind tier, std::uint64_t bytes);
  // Throws Error{kInvalidArgument} for an unknown extent or one with transfers in flight.
  void release(const Extent& extent);

  // extent.bytes bytes from src (device memory of the copier, or host memory) to the extent.
  // label names the contents in error messages (e.g. a tensor id).
  // priority orders the device copy among the others of its direction where the copier runs
  // in deadline order (host tier, device memory); other transfers ignore it.
  Transfer write(const Extent& extent, const void* src, MemoryKind kind, std::string label = {},
                 CopyPriority priority = {});
  // The extent's bytes to dst. With checksums on, a mismatch fails with Error{kChecksum}.
  Transfer read(const Extent& extent, void* dst, MemoryKind kind, CopyPriority priority = {});

  // Stops accepting transfers (later ones fail with kShutdown), fails queued ones with
  // kShutdown, lets running ones finish. Idempotent.
  void shutdown();

  TierStoreReport report() const;
  std::vector<ExtentPlacement> placement(const Extent& extent) const;
  // The watchers' timer slack as they read it back (they poll a copier whose copies complete
  // out of order).
  const PollingSlack& watcher_slack() const { return watcher_slack_; }

 private:
  struct Record;
  struct Job {
    std::shared_ptr<TransferState> state;
    Record* record = nullptr;
    std::function<void(Record&)> work;
  };
  struct JobQueue {
    std::deque<Job> jobs;
    std::condition_variable queued;
  };
  Transfer submit(const Extent& extent, const void* memory, std::string label,
                  std::function<void(Record&)> work);
  bool enqueues(const Extent& extent, MemoryKind kind) const;
  Transfer submit_host_copy(const Extent& extent, void* device, CopyDirection direction, std::string label,
                            CopyPriority priority);
  void run_job(Job& job);
  void finish_job(Job& job, std::exception_ptr error);
  // Runs the queue's jobs in order; with take_any_done (a watcher for a copier whose copies
  // complete out of issue order) whichever job's copy is done first.
  void run_queue(JobQueue& queue, bool take_any_done = false);
  void write_now(Record& record, const void* src, MemoryKind kind);
  void read_now(Record& record, void* dst, MemoryKind kind);
  void open_ssd_tier();
  void verify(const Record& record, std::uint64_t actual) const;
  SsdPipeline pipeline() const;

  DeviceCopier& copier_;
  EngineConfig config_;
  std::unique_ptr<HostTier> host_;
  // Declared before the paths: io_uring backends hold a registration of its memory.
  std::unique_ptr<PinnedBufferPool> bounce_pool_;
  std::vector<std::unique_ptr<SsdPath>> paths_;
  std::unique_ptr<StripeSet> stripes_;
  std::atomic<std::uint64_t> host_bytes_written_{0};
  std::atomic<std::uint64_t> host_bytes_read_{0};

  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Record>> records_;
  std::uint64_t next_id_ = 1;
  JobQueue queue_;  // transfers the workers carry out
  // Host-tier copies already enqueued on the device, one queue per copy stream: a watcher
  // thread waits for each in order (a stream completes its copies in order) and finishes it.
  JobQueue to_host_watch_;
  JobQueue to_device_watch_;
  PollingSlack watcher_slack_;
  bool closing_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace teraio::io
