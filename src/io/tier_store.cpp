#include "teraio/io/tier_store.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "bounce.hpp"
#include "checksum.hpp"
#include "ssd_path.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/thread_name.hpp"

namespace teraio::io {

struct TierStore::Record {
  TierKind tier = TierKind::kHost;
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
  std::uint64_t host_offset = 0;
  StripeLayout layout;
  std::string label;
  std::optional<std::uint64_t> checksum;  // guarded by the store's mutex
  bool write_failed = false;              // contents undefined until the next good write; guarded
  unsigned busy = 0;                      // transfers queued or running; guarded by the store's mutex
};

namespace {

// Never hand out bytes that a failed write left half-written.
Error unreadable(std::uint64_t id, const std::string& label, std::uint64_t bytes, TierKind tier) {
  return Error(ErrorKind::kIo,
               cat("read of extent ", id, " '", label, "' (", bytes, " bytes) on the ", to_string(tier),
                   " tier refused: its last write failed, its contents are undefined"));
}

}  // namespace

std::string_view to_string(TierKind tier) {
  return tier == TierKind::kHost ? "host" : "ssd";
}

std::string_view to_string(BackendChoice choice) {
  switch (choice) {
    case BackendChoice::kAuto: return "auto";
    case BackendChoice::kIoUring: return "io_uring";
    case BackendChoice::kPosix: return "posix";
  }
  return "?";
}

BackendChoice parse_backend_choice(std::string_view text) {
  const std::string lower = to_lower(text);
  if (lower == "auto") return BackendChoice::kAuto;
  if (lower == "io_uring" || lower == "uring") return BackendChoice::kIoUring;
  if (lower == "posix") return BackendChoice::kPosix;
  throw Error(ErrorKind::kInvalidArgument,
              cat("unknown I/O backend '", text, "' (expected auto, io_uring or posix)"));
}

TierStore::TierStore(DeviceCopier& copier, EngineConfig config)
    : copier_(copier), config_(std::move(config)) {
  if (config_.chunk_bytes == 0 || !is_aligned(config_.chunk_bytes, kPageSize)) {
    throw Error(ErrorKind::kInvalidArgument, cat("chunk size ", config_.chunk_bytes,
                                                 " must be a positive multiple of ", kPageSize, " bytes"));
  }
  if (!config_.ssd_paths.empty() && config_.ssd_capacity_per_path == 0) {
    throw Error(ErrorKind::kInvalidArgument, "SSD tier paths given without a capacity per path");
  }
  config_.chunks_in_flight = std::max(1u, config_.chunks_in_flight);
  host_ = std::make_unique<HostTier>(copier_, config_.host_capacity, config_.pin_host_in_background);
  if (!config_.ssd_paths.empty()) open_ssd_tier();
  const unsigned threads = std::max(1u, config_.transfer_threads);
  for (unsigned i = 0; i < threads; ++i) {
    workers_.emplace_back([this] {
      name_this_thread("teraio-transfer");
      run_queue(queue_);
    });
  }
  // A copier whose copies complete out of issue order: each watcher takes whichever is done.
  const bool take_any_done = !copier_.completes_in_order();
  for (JobQueue* watch : {&to_host_watch_, &to_device_watch_}) {
    const bool to_host = watch == &to_host_watch_;
    workers_.emplace_back([this, watch, take_any_done, to_host] {
      name_this_thread(to_host ? "teraio-wait-d2h" : "teraio-wait-h2d");
      // It polls while copies are out of order (run_queue): with the kernel's default slack a
      // 20 us pause lasts ~75 us (BM_PollingPause), and a copy done is reported that much later.
      watcher_slack_.start();
      run_queue(*watch, take_any_done);
    });
  }
}

void TierStore::open_ssd_tier() {
  bounce_pool_ = std::make_unique<PinnedBufferPool>(copier_, config_.chunk_bytes,
                                                    std::max(config_.bounce_pool_bytes, config_.chunk_bytes));
  std::vector<std::uint64_t> capacities;
  bool uring_warned = false;
  for (const std::string& directory : config_.ssd_paths) {
    auto path = std::make_unique<SsdPath>();
    path->file = std::make_unique<SwapFile>(directory, config_.rank, config_.ssd_capacity_per_path,
                                            config_.unlink_swap_files, config_.direct_io);
    const int fd = path->file->fd();
    if (config_.backend == BackendChoice::kPosix) {
      path->backend = make_posix_backend(fd, config_.io_threads);
    } else if (config_.backend == BackendChoice::kIoUring) {
      path->backend = make_uring_backend(fd, config_.queue_depth);
    } else {
      try {
        path->backend = make_uring_backend(fd, config_.queue_depth);
      } catch (const Error& e) {
        if (!uring_warned) log::warn("io_uring unavailable (", e.what(), "): using POSIX threads");
        uring_warned = true;
        path->backend = make_posix_backend(fd, config_.io_threads);
      }
    }
    if (config_.wrap_backend)
      path->backend = config_.wrap_backend(std::move(path->backend), path->file->path());
    // io_uring takes at most 1 GiB per registered buffer.
    if (bounce_pool_->region_size() <= kGiB) {
      path->buffers_registered =
          path->backend->register_buffer(bounce_pool_->region_data(), bounce_pool_->region_size());
    }
#if TERAIO_HAVE_CUDA
    if (!copier_.is_cuda()) {
      path->cufile_detail = "not used: the device copier is not CUDA";
    } else if (!config_.use_cufile) {
      path->cufile_detail = "disabled by configuration";
    } else if (!path->file->direct_io()) {
      path->cufile_detail = "not used: the file is not on O_DIRECT";
    } else if (!CuFileDriver::instance().usable()) {
      path->cufile_detail = cat("unusable: ", CuFileDriver::instance().status().detail);
    } else {
      try {
        path->cufile = std::make_unique<CuFileHandle>(fd, path->file->path());
        if (CuFileDriver::instance().status().nvfs_present) {
          path->cufile_detail = "GPUDirect Storage active";
        } else {
          // Without nvidia-fs cuFile only bounces through host memory itself, without the
          // pipelining of TeraIO's bounce path.
          path->cufile.reset();
          path->cufile_detail = "registered, but no nvidia-fs driver: using the bounce path";
          log::warn("cuFile on ", path->file->path(), ": no nvidia-fs driver, using the bounce path");
        }
      } catch (const Error& e) {
        log::warn("cuFile registration of ", path->file->path(), " failed (", e.what(),
                  "): using the bounce path");
        path->cufile_detail = cat("registration failed: ", e.what());
      }
    }
#else
    path->cufile_detail = "not used: CUDA not compiled in";
#endif
    capacities.push_back(path->file->capacity());
    paths_.push_back(std::move(path));
  }
  stripes_ = std::make_unique<StripeSet>(capacities, config_.stripe_unit);
}

TierStore::~TierStore() {
  shutdown();
}

void TierStore::shutdown() {
  std::deque<Job> cancelled;
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
    cancelled.swap(queue_.jobs);
  }
  // Watched copies are already on the device: they are waited for, not cancelled.
  for (JobQueue* queue : {&queue_, &to_host_watch_, &to_device_watch_}) queue->queued.notify_all();
  for (Job& job : cancelled) {
    finish_job(job, std::make_exception_ptr(
                        Error(ErrorKind::kShutdown, "transfer cancelled: the tier store is shutting down")));
  }
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

std::optional<Extent> TierStore::allocate(TierKind tier, std::uint64_t bytes) {
  auto record = std::make_unique<Record>();
  record->tier = tier;
  record->bytes = bytes;
  if (tier == TierKind::kHost) {
    auto offset = host_->allocate(bytes);
    if (!offset) return std::nullopt;
    record->host_offset = *offset;
  } else {
    if (!stripes_) return std::nullopt;
    auto layout = stripes_->allocate(bytes);
    if (!layout) return std::nullopt;
    record->layout = std::move(*layout);
  }
  std::lock_guard lock(mutex_);
  record->id = next_id_++;
  const Extent extent{tier, record->id, bytes};
  records_.emplace(record->id, std::move(record));
  return extent;
}

void TierStore::release(const Extent& extent) {
  std::unique_ptr<Record> record;
  {
    std::lock_guard lock(mutex_);
    auto found = records_.find(extent.id);
    if (found == records_.end()) {
      throw Error(ErrorKind::kInvalidArgument, cat("release of unknown extent ", extent.id));
    }
    if (found->second->busy > 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  cat("release of extent ", extent.id, " '", found->second->label, "' with ",
                      found->second->busy, " transfers in flight"));
    }
    record = std::move(found->second);
    records_.erase(found);
  }
  if (record->tier == TierKind::kHost) {
    host_->release(record->host_offset, record->bytes);
  } else {
    stripes_->release(record->layout);
  }
}

Transfer TierStore::submit(const Extent& extent, const void* memory, std::string label,
                           std::function<void(Record&)> work) {
  auto state = std::make_shared<TransferState>();
  {
    std::lock_guard lock(mutex_);
    if (closing_) {
      state->finish(
          std::make_exception_ptr(Error(ErrorKind::kShutdown, cat("transfer of extent ", extent.id,
                                                                  " refused: the tier store is shut down"))));
      return Transfer(state);
    }
    auto found = records_.find(extent.id);
    if (found == records_.end())
      throw Error(ErrorKind::kInvalidArgument, cat("transfer of unknown extent ", extent.id));
    if (memory == nullptr && extent.bytes > 0) {
      throw Error(ErrorKind::kInvalidArgument, cat("transfer of extent ", extent.id, " with a null buffer"));
    }
    Record& record = *found->second;
    if (!label.empty()) record.label = std::move(label);
    ++record.busy;
    queue_.jobs.push_back(Job{state, &record, std::move(work)});
  }
  queue_.queued.notify_one();
  return Transfer(state);
}

bool TierStore::enqueues(const Extent& extent, MemoryKind kind) const {
  return extent.tier == TierKind::kHost && kind == MemoryKind::kDevice && extent.bytes > 0 &&
         !config_.checksums && config_.enqueue_host_copies.value_or(copier_.is_cuda());
}

Transfer TierStore::submit_host_copy(const Extent& extent, void* device, CopyDirection direction,
                                     std::string label, CopyPriority priority) {
  const bool to_host = direction == CopyDirection::kToHost;
  if (device == nullptr) {
    throw Error(ErrorKind::kInvalidArgument, cat("transfer of extent ", extent.id, " with a null buffer"));
  }
  host_->wait_pinned();
  auto state = std::make_shared<TransferState>();
  JobQueue& watch = to_host ? to_host_watch_ : to_device_watch_;
  {
    std::lock_guard lock(mutex_);
    auto found = records_.find(extent.id);
    if (closing_ || found == records_.end()) {
      if (!closing_) throw Error(ErrorKind::kInvalidArgument, cat("transfer of unknown extent ", extent.id));
      state->finish(
          std::make_exception_ptr(Error(ErrorKind::kShutdown, cat("transfer of extent ", extent.id,
                                                                  " refused: the tier store is shut down"))));
      return Transfer(state);
    }
    Record& record = *found->second;
    if (!to_host && record.write_failed) {
      state->finish(std::make_exception_ptr(unreadable(record.id, record.label, record.bytes, record.tier)));
      return Transfer(state);
    }
    std::byte* at = host_->data(record.host_offset);
    // Under the store's lock, so that the copies reach the copier in submission order: in issue
    // order that is the order they complete, which the watcher waits in (run_queue).
    state->device_side =
        to_host ? std::shared_ptr<CopyEvent>(copier_.to_host(at, device, record.bytes, priority))
                : std::shared_ptr<CopyEvent>(copier_.to_device(device, at, record.bytes, priority));
    if (!label.empty()) record.label = std::move(label);
    ++record.busy;
    watch.jobs.push_back(Job{state, &record, [this, event = state->device_side, to_host](Record& r) {
                               if (!to_host) {
                                 event->wait();
                                 host_bytes_read_ += r.bytes;
                                 return;
                               }
                               std::exception_ptr failure;
                               try {
                                 event->wait();
                               } catch (...) {
                                 failure = std::current_exception();
                               }
                               {
                                 std::lock_guard guard(mutex_);
                                 r.checksum.reset();
                                 r.write_failed = failure != nullptr;
                               }
                               if (failure) std::rethrow_exception(failure);
                               host_bytes_written_ += r.bytes;
                             }});
  }
  watch.queued.notify_one();
  return Transfer(state);
}

void TierStore::run_job(Job& job) {
  std::exception_ptr error;
  try {
    job.work(*job.record);
  } catch (...) {
    error = std::current_exception();
  }
  finish_job(job, std::move(error));
}

void TierStore::finish_job(Job& job, std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    --job.record->busy;
  }
  job.state->finish(std::move(error));
}

void TierStore::run_queue(JobQueue& queue, bool take_any_done) {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      queue.queued.wait(lock, [&] { return closing_ || !queue.jobs.empty(); });
      if (queue.jobs.empty()) return;
      auto next = queue.jobs.begin();
      if (take_any_done) {
        next = std::find_if(queue.jobs.begin(), queue.jobs.end(), [](Job& j) {
          try {
            return j.state->device_side->ready();
          } catch (...) {
            return true;  // failed: the job's wait reports it
          }
        });
      }
      if (next == queue.jobs.end()) {
        // Copies take ~100 us and up: looking again ~25 us later (with the watchers' slack,
        // BM_PollingPause) costs nothing they notice.
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        continue;
      }
      job = std::move(*next);
      queue.jobs.erase(next);
    }
    run_job(job);
  }
}

Transfer TierStore::write(const Extent& extent, const void* src, MemoryKind kind, std::string label,
                          CopyPriority priority) {
  // The copier reads the source; the const is dropped only to share submit_host_copy with reads.
  if (enqueues(extent, kind))
    return submit_host_copy(extent, const_cast<void*>(src), CopyDirection::kToHost, std::move(label),
                            priority);
  return submit(extent, src, std::move(label), [this, src, kind](Record& record) {
    try {
      write_now(record, src, kind);
    } catch (...) {
      std::lock_guard lock(mutex_);
      record.write_failed = true;
      throw;
    }
  });
}

Transfer TierStore::read(const Extent& extent, void* dst, MemoryKind kind, CopyPriority priority) {
  if (enqueues(extent, kind)) return submit_host_copy(extent, dst, CopyDirection::kToDevice, {}, priority);
  return submit(extent, dst, {}, [this, dst, kind](Record& record) { read_now(record, dst, kind); });
}

void TierStore::write_now(Record& record, const void* src, MemoryKind kind) {
  std::optional<std::uint64_t> checksum;
  if (record.tier == TierKind::kHost) {
    host_->wait_pinned();
    std::byte* at = host_->data(record.host_offset);
    if (record.bytes > 0) {
      if (kind == MemoryKind::kDevice) {
        copier_.to_host(at, src, record.bytes)->wait();
      } else {
        std::memcpy(at, src, record.bytes);
      }
    }
    if (config_.checksums) {
      Xxh3Stream hash;
      hash.update(at, record.bytes);
      checksum = hash.digest();
    }
    host_bytes_written_ += record.bytes;
  } else {
    const std::uint64_t digest =
        ssd_write(pipeline(), record.layout.pieces, static_cast<const std::byte*>(src), kind);
    if (config_.checksums) checksum = digest;
  }
  std::lock_guard lock(mutex_);
  record.checksum = checksum;
  record.write_failed = false;
}

void TierStore::read_now(Record& record, void* dst, MemoryKind kind) {
  {
    std::lock_guard lock(mutex_);
    if (record.write_failed) {
      throw unreadable(record.id, record.label, record.bytes, record.tier);
    }
  }
  if (record.tier == TierKind::kHost) {
    host_->wait_pinned();
    std::byte* at = host_->data(record.host_offset);
    if (config_.checksums) {
      // Verified before the copy: corrupt bytes never reach the caller from the host tier.
      Xxh3Stream hash;
      hash.update(at, record.bytes);
      verify(record, hash.digest());
    }
    if (record.bytes > 0) {
      if (kind == MemoryKind::kDevice) {
        copier_.to_device(dst, at, record.bytes)->wait();
      } else {
        std::memcpy(dst, at, record.bytes);
      }
    }
    host_bytes_read_ += record.bytes;
    return;
  }
  const std::uint64_t digest = ssd_read(pipeline(), record.layout.pieces, static_cast<std::byte*>(dst), kind);
  if (config_.checksums) verify(record, digest);
}

SsdPipeline TierStore::pipeline() const {
  SsdPipeline pipe{copier_,           *bounce_pool_,     {}, config_.chunks_in_flight, config_.chunk_bytes,
                   config_.checksums, !config_.checksums};
  for (const auto& path : paths_) pipe.paths.push_back(path.get());
  return pipe;
}

void TierStore::verify(const Record& record, std::uint64_t actual) const {
  std::optional<std::uint64_t> expected;
  {
    std::lock_guard lock(mutex_);
    expected = record.checksum;
  }
  if (!expected || *expected == actual) return;
  std::string where;
  if (record.tier == TierKind::kHost) {
    where = cat("host arena offset ", record.host_offset);
  } else {
    for (const auto& r : record.layout.reservations) {
      where += cat(where.empty() ? "" : ", ", paths_[r.path]->file->path(), " offset ", r.offset, " (",
                   r.bytes, " bytes)");
    }
  }
  throw Error(ErrorKind::kChecksum,
              cat("checksum mismatch reading extent ", record.id, " '", record.label, "' (", record.bytes,
                  " bytes) from the ", to_string(record.tier), " tier at ", where, ": written ", std::hex,
                  *expected, ", read ", actual));
}

std::vector<ExtentPlacement> TierStore::placement(const Extent& extent) const {
  std::lock_guard lock(mutex_);
  auto found = records_.find(extent.id);
  if (found == records_.end())
    throw Error(ErrorKind::kInvalidArgument, cat("placement of unknown extent ", extent.id));
  const Record& record = *found->second;
  if (record.tier == TierKind::kHost) return {{"host", record.host_offset, 0, record.bytes}};
  std::vector<ExtentPlacement> out;
  for (const StripePiece& piece : record.layout.pieces) {
    out.push_back({paths_[piece.path]->file->path(), piece.file_offset, piece.logical_offset, piece.length});
  }
  return out;
}

}  // namespace teraio::io
