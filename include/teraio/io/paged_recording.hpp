// io/paged_recording: the requests a PagedDeviceMemory served (allocations, frees, streams
// recorded on blocks, step marks with the allocator's own counts), kept as they came, written to
// a text file and read back; io/paged_replay serves them again. Why: under W3 the paged allocator
// maps 8 000-11 000 pages of 16 MiB a step, 1.2-3.1 s of host time (session 42). How many pages a
// policy or a page size maps is mostly a property of the request sequence, not of the GPU: with the
// sequence recorded once on the GPU, policies can be compared here without device time or the
// step-to-step noise of a training run.
//
// The file: a header line, then one request a line:
//   # teraio paged requests v1 page=BYTES cap=BYTES
//   a ID BYTES STREAM   an allocation (ID: the block, numbered from 1; STREAM: numbered from 0
//                       in order of first sight)
//   f ID                its free
//   u ID STREAM         work on another stream uses the block (record_use)
//   s K=V ...           a step ends; what the allocator counted in it (pages, reused, grown,
//                       mapped, taken, waits), for a replay to be checked against
// A recording begins with the allocator's state: the blocks live then, as allocations, and its
// freed (cached) blocks, as allocations freed at once, so that frees name blocks a replay has and
// its cache starts near the real one (the address ranges' room to grow is not kept).
// This module knows nothing of the allocator: it keeps addresses and stream handles as numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace teraio::io {

struct PagedRequest {
  enum class Kind : std::uint8_t { kAllocate, kFree, kUse, kStep };
  Kind kind = Kind::kStep;
  std::uint64_t block = 0;   // kAllocate, kFree, kUse
  std::uint64_t bytes = 0;   // kAllocate
  std::uint32_t stream = 0;  // kAllocate, kUse
};

// What the allocator itself counted in a recorded step (PagedMemoryStats' growth).
struct RecordedCounts {
  std::uint64_t pages_mapped = 0;
  std::uint64_t reused = 0;
  std::uint64_t grown_blocks = 0;
  std::uint64_t mapped_blocks = 0;
  std::uint64_t taken_blocks = 0;
  std::uint64_t device_waits = 0;
};

class PagedRecording {
 public:
  PagedRecording(std::uint64_t page_bytes, std::uint64_t cap_bytes);

  // As the allocator served them (called under its lock). A free or use of an address the
  // recording never saw allocated is left out: the block came and went before it began.
  void allocated(std::uintptr_t address, std::uint64_t bytes, const void* stream);
  void freed(std::uintptr_t address);
  void used(std::uintptr_t address, const void* stream);
  // `counted`: the allocator's counts since the previous mark (or the start).
  void step(const RecordedCounts& counted);

  std::uint64_t page_bytes() const { return page_bytes_; }
  std::uint64_t cap_bytes() const { return cap_bytes_; }
  const std::vector<PagedRequest>& requests() const { return requests_; }
  // One a step mark, in order; nullopt for a mark read without counts.
  const std::vector<std::optional<RecordedCounts>>& counted() const { return counted_; }

  // Throws Error(kIo) when the file cannot be written or read, Error(kFormat) for a line that
  // is not a request of the format above (its number named).
  void write(const std::string& path) const;
  static PagedRecording read(const std::string& path);

 private:
  std::uint32_t stream_number(const void* stream);

  std::uint64_t page_bytes_;
  std::uint64_t cap_bytes_;
  std::vector<PagedRequest> requests_;
  std::vector<std::optional<RecordedCounts>> counted_;
  std::unordered_map<std::uintptr_t, std::uint64_t> live_;  // address -> block, while allocated
  std::unordered_map<const void*, std::uint32_t> streams_;
  std::uint64_t next_block_ = 1;
};

}  // namespace teraio::io
