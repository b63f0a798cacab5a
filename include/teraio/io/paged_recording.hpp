// io/paged_recording: the requests a PagedDeviceMemory served (allocations, frees, streams
// recorded on blocks, step marks), kept as they came, written to a text file and replayed
// through a PagedDeviceMemory on a driver that only counts. Why: under W3 the paged allocator
// maps 8 000-11 000 pages of 16 MiB a step, 1.2-3.1 s of host time (session 42). How many pages
// a policy or a page size maps is a property of the request sequence, not of the GPU: with the
// sequence recorded once on the GPU, policies can be compared here, exactly, without device time
// or the step-to-step noise of a training run.
//
// The file: a header line, then one request a line:
//   # teraio paged requests v1 page=BYTES cap=BYTES
//   a ID BYTES STREAM   an allocation (ID: the block, numbered from 1; STREAM: numbered from 0
//                       in order of first sight)
//   f ID                its free
//   u ID STREAM         work on another stream uses the block (record_use)
//   s                   a step ends
// A recording begins with the blocks live at its start, as allocations, so that each free names
// a block the replay has.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "teraio/io/paged_device_memory.hpp"

namespace teraio::io {

struct PagedRequest {
  enum class Kind : std::uint8_t { kAllocate, kFree, kUse, kStep };
  Kind kind = Kind::kStep;
  std::uint64_t block = 0;   // kAllocate, kFree, kUse
  std::uint64_t bytes = 0;   // kAllocate
  std::uint32_t stream = 0;  // kAllocate, kUse
};

class PagedRecording {
 public:
  PagedRecording(std::uint64_t page_bytes, std::uint64_t cap_bytes);

  // As the allocator served them (called under its lock). A free or use of an address the
  // recording never saw allocated is left out: the block came and went before it began.
  void allocated(DeviceAddress address, std::uint64_t bytes, StreamHandle stream);
  void freed(DeviceAddress address);
  void used(DeviceAddress address, StreamHandle stream);
  void step();

  std::uint64_t page_bytes() const { return page_bytes_; }
  std::uint64_t cap_bytes() const { return cap_bytes_; }
  const std::vector<PagedRequest>& requests() const { return requests_; }

  // Throws Error(kIo) when the file cannot be written or read, Error(kFormat) for a line that
  // is not a request of the format above (its number named).
  void write(const std::string& path) const;
  static PagedRecording read(const std::string& path);

 private:
  std::uint32_t stream_number(StreamHandle stream);

  std::uint64_t page_bytes_;
  std::uint64_t cap_bytes_;
  std::vector<PagedRequest> requests_;
  std::unordered_map<DeviceAddress, std::uint64_t> live_;  // address -> block, while allocated
  std::unordered_map<StreamHandle, std::uint32_t> streams_;
  std::uint64_t next_block_ = 1;
};

struct PagedReplayOptions {
  std::uint64_t page_bytes = 0;  // 0: the recording's
  std::uint64_t cap_bytes = 0;   // 0: the recording's
  // A block freed at request i counts as done on its streams from request i + lag on: 0 is a
  // device that keeps up with the host; a larger lag holds freed blocks back from other streams.
  std::uint64_t lag = 0;
};

struct PagedReplayStep {
  PagedMemoryStats counts;    // this step's growth of the counters (the *_s fields stay 0)
  std::uint64_t refused = 0;  // allocations the replay could not serve (out of memory)
};

// The recording's requests through a fresh PagedDeviceMemory on a counting driver; a step a
// step mark ends (requests after the last mark are left out). Throws Error(kInvalidArgument)
// for a page the allocator refuses, Error(kFormat) for requests that contradict themselves (a
// block allocated twice, or freed or used before its allocation).
std::vector<PagedReplayStep> replay(const PagedRecording& recording, const PagedReplayOptions& options);

}  // namespace teraio::io
