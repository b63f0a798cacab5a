// io/paged_replay: a recording of a paged allocator's requests (io/paged_recording) served
// again by a fresh PagedDeviceMemory on a driver that hands out pages and addresses and only
// counts, step by step; with another page size or cap, what those would have done.
//
// What it cannot reproduce: when the device really finished with a block (`lag` stands in, in
// requests, not time: 0 is a device that keeps up; on W3 the host runs ahead, so 0 undercounts
// device waits and blocks passed over), the real cache's address ranges and their room to grow
// (the first step warms the replay's own), requests the real allocator refused (not recorded),
// and a program's answer to a refusal (TeraIO moves tensors out and asks again; the replay only
// counts the refusal). Each step line's recorded counts say how close it came.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "teraio/io/paged_device_memory.hpp"
#include "teraio/io/paged_recording.hpp"

namespace teraio::io {

struct PagedReplayOptions {
  std::uint64_t page_bytes = 0;  // 0: the recording's
  std::uint64_t cap_bytes = 0;   // 0: the recording's
  // A block freed at request i counts as done on its streams from request i + lag on.
  std::uint64_t lag = 0;
  // Each new address range's length in its first block's (0: the allocator's default,
  // PagedDeviceMemory::kRangeLengths).
  std::uint64_t range_lengths = 0;
};

// `options` with the recording's page and cap where it leaves them 0: what a replay runs with.
PagedReplayOptions resolved(const PagedReplayOptions& options, const PagedRecording& recording);

struct PagedReplayStep {
  // This step's growth of the counters (counter_growth; its times are the counting driver's, near 0),
  // held_bytes at the step's end, peak_held_bytes since the replay began.
  PagedMemoryStats counts;
  std::uint64_t refused = 0;               // allocations the replay could not serve (out of memory)
  std::optional<RecordedCounts> recorded;  // what the allocator counted in the same step
};

// A step a step mark ends (requests after the last mark are left out). Throws
// Error(kInvalidArgument) for a page the allocator refuses or a cap under a page, Error(kFormat)
// for requests that contradict themselves (a block allocated twice, or freed or used before its
// allocation).
std::vector<PagedReplayStep> replay(const PagedRecording& recording, const PagedReplayOptions& options);

}  // namespace teraio::io
