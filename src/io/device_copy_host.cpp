// The host implementation of DeviceCopier: "device memory" is ordinary memory, so a copy is
// a memcpy that has completed when the call returns.
#include <cstdlib>
#include <cstring>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/device_copy.hpp"

namespace teraio::io {
namespace {

class CompletedEvent final : public CopyEvent {
 public:
  bool ready() override { return true; }
  void wait() override {}
  StreamWait block_stream(void*) override { return StreamWait::kDone; }
};

class HostCopier final : public DeviceCopier {
 public:
  std::string name() const override { return "host"; }
  bool is_cuda() const override { return false; }
  std::unique_ptr<CopyEvent> to_host(void* host_dst, const void* device_src, std::size_t n,
                                     CopyPriority) override {
    if (n > 0) std::memcpy(host_dst, device_src, n);
    return std::make_unique<CompletedEvent>();
  }
  std::unique_ptr<CopyEvent> to_device(void* device_dst, const void* host_src, std::size_t n,
                                       CopyPriority) override {
    if (n > 0) std::memcpy(device_dst, host_src, n);
    return std::make_unique<CompletedEvent>();
  }
  void pin(void*, std::size_t) override {}
  void unpin(void*) override {}
  void* allocate_device(std::size_t n) override {
    void* p = std::aligned_alloc(kPageSize, align_up(n == 0 ? 1 : n, kPageSize));
    if (p == nullptr) throw Error(ErrorKind::kIo, cat("cannot allocate ", n, " bytes of host-device memory"));
    return p;
  }
  void free_device(void* device) override { std::free(device); }
};

}  // namespace

std::string_view to_string(StreamWait how) {
  switch (how) {
    case StreamWait::kDone: return "done";
    case StreamWait::kQueued: return "queued";
    case StreamWait::kFlushed: return "flushed";
    case StreamWait::kGated: return "gated";
    case StreamWait::kAwaited: return "awaited";
  }
  return "?";
}

std::string_view to_string(CopyOrder order) {
  switch (order) {
    case CopyOrder::kIssue: return "issue";
    case CopyOrder::kDeadline: return "deadline";
    case CopyOrder::kDeadlineAlone: return "deadline-alone";
    case CopyOrder::kDeadlineChunked: return "deadline-chunked";
    case CopyOrder::kDeadlineHostWaits: return "deadline-host-waits";
    case CopyOrder::kDeadlineHostWaitsIn: return "deadline-host-waits-in";
    case CopyOrder::kDeadlineDeviceWaitsIn: return "deadline-device-waits-in";
  }
  return "?";
}

CopyOrder parse_copy_order(std::string_view text) {
  for (const CopyOrder order :
       {CopyOrder::kIssue, CopyOrder::kDeadline, CopyOrder::kDeadlineAlone, CopyOrder::kDeadlineChunked,
        CopyOrder::kDeadlineHostWaits, CopyOrder::kDeadlineHostWaitsIn, CopyOrder::kDeadlineDeviceWaitsIn})
    if (text == to_string(order)) return order;
  throw Error(ErrorKind::kInvalidArgument,
              cat("unknown copy order '", text,
                  "' (expected issue, deadline, deadline-alone, deadline-chunked, deadline-host-waits, "
                  "deadline-host-waits-in or deadline-device-waits-in)"));
}

std::string_view to_string(HeldCopies held) {
  return held == HeldCopies::kBothWays ? "both" : "to-host";
}

HeldCopies parse_held_copies(std::string_view text) {
  for (const HeldCopies held : {HeldCopies::kBothWays, HeldCopies::kToHost})
    if (text == to_string(held)) return held;
  throw Error(ErrorKind::kInvalidArgument,
              cat("unknown copies to hold '", text, "' (expected both or to-host)"));
}

std::size_t checked_lane_chunk(std::size_t bytes) {
  if (bytes < kSmallestLaneChunkBytes || bytes > kLargestLaneChunkBytes || bytes % 4096 != 0)
    throw Error(
        ErrorKind::kInvalidArgument,
        cat("a copy lane's chunk must be a multiple of 4 KiB from ", format_bytes(kSmallestLaneChunkBytes),
            " to ", format_bytes(kLargestLaneChunkBytes), ", got ", bytes, " bytes"));
  return bytes;
}

std::unique_ptr<DeviceCopier> make_host_copier() {
  return std::make_unique<HostCopier>();
}

}  // namespace teraio::io
