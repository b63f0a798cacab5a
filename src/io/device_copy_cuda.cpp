// The CUDA implementation of DeviceCopier: one non-blocking stream per direction, so that an
// offload (device -> host) never queues behind a prefetch (host -> device) and both use the
// two copy engines at once. In issue order each copy goes straight onto its stream and one
// pooled event marks its completion; in deadline order each direction is a CopyLane.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "copy_lane_cuda.hpp"
#include "cuda_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/numa.hpp"

namespace teraio::io {
namespace {

using namespace cuda_detail;

class CudaCopyEvent final : public CopyEvent {
 public:
  CudaCopyEvent(std::shared_ptr<EventPool> pool, cudaEvent_t event, std::string what)
      : pool_(std::move(pool)), event_(event), what_(std::move(what)) {}
  ~CudaCopyEvent() override { pool_->give_back(event_); }
  CudaCopyEvent(const CudaCopyEvent&) = delete;
  CudaCopyEvent& operator=(const CudaCopyEvent&) = delete;

  bool ready() override {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    check(rc, cat("cudaEventQuery(", what_, ")"));
    return true;
  }
  void wait() override { check(cudaEventSynchronize(event_), cat("cudaEventSynchronize(", what_, ")")); }
  // The wait binds to the event's latest record, so the event may go back to the pool and be
  // recorded again by another copy without changing what this stream waits for.
  StreamWait block_stream(void* stream) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0),
          cat("cudaStreamWaitEvent(", what_, ")"));
    return StreamWait::kQueued;  // issue order: every copy goes onto its stream when issued
  }

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t event_;
  std::string what_;
};

// The lanes held from its making to its end (DeviceCopier::hold_copies).
class LaneHold final : public CopyHold {
 public:
  explicit LaneHold(std::vector<std::shared_ptr<CopyLane>> lanes) {
    // Each lane held joins lanes_ at once, so that a failure part-way releases those held.
    try {
      for (auto& lane : lanes) {
        lane->hold();
        lanes_.push_back(std::move(lane));
      }
    } catch (...) {
      release();
      throw;
    }
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(kCopyHoldWaitSeconds));
    quiet_ = true;
    for (const auto& lane : lanes_) quiet_ = lane->wait_idle(until) && quiet_;
  }
  ~LaneHold() override { release(); }
  LaneHold(const LaneHold&) = delete;
  LaneHold& operator=(const LaneHold&) = delete;
  bool quiet() const override { return quiet_; }

 private:
  void release() noexcept {
    for (const auto& lane : lanes_) lane->release();
  }

  std::vector<std::shared_ptr<CopyLane>> lanes_;
  bool quiet_ = false;
};

// CUDA does not see what a stream's wait on a flag waits for (the lane's copy and the setting of
// the flag, queued later on the lane's stream). With every stream on one hardware queue
// (CUDA_DEVICE_MAX_CONNECTIONS=1, as some Megatron setups set) those would stand behind the
// wait, and the GPU would wait forever: refused. With the default 8 queues a lane's stream may
// still share one with a compute stream; whether CUDA then lets the copy by is for the GPU runs
// to show (the copier tests end a hang with a watchdog).
void refuse_a_single_hardware_queue() {
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (connections != nullptr && std::atoi(connections) == 1)
    throw Error(ErrorKind::kUnsupported,
                "the deadline-device-waits-in copy order needs more than one hardware queue: with "
                "CUDA_DEVICE_MAX_CONNECTIONS=1 the copy a compute stream waits for on a flag would queue "
                "behind that wait");
}

class CudaCopier final : public DeviceCopier {
 public:
  CudaCopier(int device, CopyOrder order, std::size_t chunk_bytes)
      : device_(device),
        order_(order),
        chunk_bytes_(chunk_bytes),
        events_(std::make_shared<EventPool>(device)),
        to_host_(device),
        to_device_(device) {
    if (order == CopyOrder::kIssue) return;
    if (order == CopyOrder::kDeadlineDeviceWaitsIn) refuse_a_single_hardware_queue();
    const bool alone = order == CopyOrder::kDeadlineAlone;
    const bool chunked = order == CopyOrder::kDeadlineChunked;
    const bool host_waits_out = order == CopyOrder::kDeadlineHostWaits;
    const bool host_waits_in = host_waits_out || order == CopyOrder::kDeadlineHostWaitsIn;
    const bool device_waits_in = order == CopyOrder::kDeadlineDeviceWaitsIn;
    lanes_[0] =
        std::make_shared<CopyLane>(device, cudaMemcpyDeviceToHost, events_,
                                   CopyLane::Options{alone, chunked, host_waits_out, false, chunk_bytes});
    lanes_[1] = std::make_shared<CopyLane>(
        device, cudaMemcpyHostToDevice, events_,
        CopyLane::Options{alone, chunked, host_waits_in, device_waits_in, chunk_bytes});
  }

  std::string name() const override { return cat("cuda:", device_); }
  bool is_cuda() const override { return true; }
  std::optional<int> numa_node() const override {
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return pci_device_numa_node(bus_id);
  }
  std::string order() const override {
    if (!lanes_[0]) return "issue order";
    // As the dispatchers read their slack back: what runs, not what was asked.
    const std::string to_host = lanes_[0]->polling_slack().describe();
    const std::string to_device = lanes_[1]->polling_slack().describe();
    return cat(
        to_string(order_), " order (", format_bytes(chunk_bytes_), " chunks; copies waited for ",
        order_ == CopyOrder::kDeadlineAlone ? "alone on" : "sharing", " the link",
        order_ == CopyOrder::kDeadlineChunked ? ", their rests in chunks too" : "",
        order_ == CopyOrder::kDeadlineHostWaits ? ", the host waiting for their markers" : "",
        order_ == CopyOrder::kDeadlineHostWaitsIn ? ", the host waiting for the markers of copies in" : "",
        order_ == CopyOrder::kDeadlineDeviceWaitsIn
            ? ", the GPU waiting on flags for copies in ahead of their markers"
            : "",
        "; dispatchers poll with ",
        to_host == to_device ? to_host : cat(to_host, " (to host), ", to_device, " (to device)"), ")");
  }
  bool completes_in_order() const override { return !lanes_[0]; }
  void serve_plan(bool planned) override {
    for (const auto& lane : lanes_)
      if (lane) lane->serve_plan(planned);
  }
  std::optional<LinkActivities> take_link_activity() override {
    if (!lanes_[0]) return std::nullopt;
    return LinkActivities{lanes_[0]->take_activity(), lanes_[1]->take_activity()};
  }

  std::unique_ptr<CopyHold> hold_copies(HeldCopies held) override {
    if (!lanes_[0]) return nullptr;
    std::vector<std::shared_ptr<CopyLane>> lanes{lanes_[0]};  // the lane to the host
    if (held == HeldCopies::kBothWays) lanes.push_back(lanes_[1]);
    return std::make_unique<LaneHold>(std::move(lanes));
  }

  std::unique_ptr<CopyEvent> to_host(void* host_dst, const void* device_src, std::size_t n,
                                     CopyPriority priority) override {
    if (lanes_[0])
      return lanes_[0]->copy(host_dst, device_src, n, priority,
                             describe("device->host", n, device_src, host_dst));
    return copy(host_dst, device_src, n, cudaMemcpyDeviceToHost, to_host_, to_host_mutex_, "device->host");
  }
  std::unique_ptr<CopyEvent> to_device(void* device_dst, const void* host_src, std::size_t n,
                                       CopyPriority priority) override {
    if (lanes_[1])
      return lanes_[1]->copy(device_dst, host_src, n, priority,
                             describe("host->device", n, host_src, device_dst));
    return copy(device_dst, host_src, n, cudaMemcpyHostToDevice, to_device_, to_device_mutex_,
                "host->device");
  }

  void pin(void* host, std::size_t n) override {
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    check(cudaHostRegister(host, n, cudaHostRegisterDefault),
          cat("cudaHostRegister(", host, ", ", n, " bytes)"));
  }
  void unpin(void* host) override { check(cudaHostUnregister(host), cat("cudaHostUnregister(", host, ")")); }

  void* allocate_device(std::size_t n) override {
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    void* p = nullptr;
    check(cudaMalloc(&p, n == 0 ? 1 : n), cat("cudaMalloc(", format_bytes(n), " on ", name(), ")"));
    return p;
  }
  void wait_for_stream(void* compute_stream, CopyDirection direction) override {
    auto* stream = static_cast<cudaStream_t>(compute_stream);
    const bool to_host = direction == CopyDirection::kToHost;
    if (const auto& lane = lanes_[to_host ? 0 : 1]) {
      lane->wait_for(stream);
      return;
    }
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    cudaEvent_t event = events_->take();
    // The event is only a marker in the compute stream; giving it back right away is safe
    // because the wait below binds to this record before the event can be recorded again.
    try {
      check(cudaEventRecord(event, stream), "cudaEventRecord(compute stream)");
      std::lock_guard lock(to_host ? to_host_mutex_ : to_device_mutex_);
      check(
          cudaStreamWaitEvent((to_host ? to_host_ : to_device_).get(), event, 0),
          to_host ? "cudaStreamWaitEvent(device->host stream)" : "cudaStreamWaitEvent(host->device stream)");
    } catch (...) {
      events_->give_back(event);
      throw;
    }
    events_->give_back(event);
  }

  void free_device(void* device) override {
    if (device == nullptr) return;
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    check(cudaFree(device), cat("cudaFree(", device, ")"));
  }

 private:
  std::string describe(const char* direction, std::size_t n, const void* src, const void* dst) const {
    return cat(direction, " ", n, " bytes ", src, " -> ", dst, " on ", name());
  }

  std::unique_ptr<CopyEvent> copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind,
                                  const Stream& stream, std::mutex& mutex, const char* direction) {
    const std::string what = describe(direction, n, src, dst);
    cudaEvent_t event = events_->take();
    auto completion = std::make_unique<CudaCopyEvent>(events_, event, what);
    check(cudaSetDevice(device_), cat("cudaSetDevice(", device_, ")"));
    // The lock keeps each event right behind its own copy: without it another thread's copy
    // could slip in between and this event would also wait for that one.
    std::lock_guard lock(mutex);
    if (n > 0) check(cudaMemcpyAsync(dst, src, n, kind, stream.get()), cat("cudaMemcpyAsync(", what, ")"));
    check(cudaEventRecord(event, stream.get()), cat("cudaEventRecord(", what, ")"));
    return completion;
  }

  int device_;
  const CopyOrder order_;
  const std::size_t chunk_bytes_;  // the lanes' piece (deadline orders)
  std::shared_ptr<EventPool> events_;
  Stream to_host_;
  Stream to_device_;
  std::mutex to_host_mutex_;
  std::mutex to_device_mutex_;
  // Deadline order: {device->host, host->device}; empty in issue order.
  std::shared_ptr<CopyLane> lanes_[2];
};

}  // namespace

bool cuda_compiled_in() {
  return true;
}

CudaInventory cuda_inventory() {
  CudaInventory inventory;
  int runtime = 0;
  int driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  const std::string versions = cat("runtime ", runtime / 1000, ".", runtime % 1000 / 10, ", driver ",
                                   driver / 1000, ".", driver % 1000 / 10);
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    inventory.detail = cat(versions, "; no usable device: cudaGetDeviceCount: ", cudaGetErrorString(rc));
    return inventory;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      cudaGetLastError();
      inventory.devices.push_back(cat(d, ": properties unavailable"));
      continue;
    }
    inventory.devices.push_back(cat(d, ": ", prop.name, ", ", format_bytes(prop.totalGlobalMem), ", compute ",
                                    prop.major, ".", prop.minor));
  }
  inventory.detail = count == 0 ? cat(versions, "; no CUDA device visible") : versions;
  return inventory;
}

std::unique_ptr<DeviceCopier> make_cuda_copier(int device, CopyOrder order, std::size_t chunk_bytes) {
  checked_lane_chunk(chunk_bytes);
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count) {
    throw Error(ErrorKind::kCuda, cat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  return std::make_unique<CudaCopier>(device, order, chunk_bytes);
}

}  // namespace teraio::io
