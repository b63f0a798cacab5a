// PagedDeviceMemory's recordings (io/paged_recording): the state a recording starts from, the
// step marks with the allocator's own counts, and the counters' growth that the marks and the
// replay (io/paged_replay) both take. The hooks in allocate, free and record_use stay beside
// the code they record.
#include <memory>
#include <mutex>

#include "teraio/io/paged_device_memory.hpp"
#include "teraio/io/paged_recording.hpp"

namespace teraio::io {

PagedMemoryStats counter_growth(const PagedMemoryStats& after, const PagedMemoryStats& before) {
  PagedMemoryStats d = after;
  d.allocations -= before.allocations;
  d.small_allocations -= before.small_allocations;
  d.reused -= before.reused;
  d.split_blocks -= before.split_blocks;
  d.joined_blocks -= before.joined_blocks;
  d.grown_blocks -= before.grown_blocks;
  d.recorded_uses -= before.recorded_uses;
  d.mapped_blocks -= before.mapped_blocks;
  d.taken_blocks -= before.taken_blocks;
  d.pages_mapped -= before.pages_mapped;
  d.pages_unmapped -= before.pages_unmapped;
  d.device_waits -= before.device_waits;
  d.map_s -= before.map_s;
  d.access_s -= before.access_s;
  d.unmap_s -= before.unmap_s;
  d.slow_maps -= before.slow_maps;
  d.slow_map_s -= before.slow_map_s;
  d.slow_unmaps -= before.slow_unmaps;
  d.slow_unmap_s -= before.slow_unmap_s;
  d.copy_holds -= before.copy_holds;
  d.copy_holds_not_quiet -= before.copy_holds_not_quiet;
  d.copy_hold_s -= before.copy_hold_s;
  d.out_of_memory -= before.out_of_memory;
  d.emptied -= before.emptied;
  return d;
}

void PagedDeviceMemory::start_recording() {
  const std::lock_guard lock(mutex_);
  recording_ = std::make_unique<PagedRecording>(page_, cap_pages_ * page_);
  recorded_since_ = stats_;
  // The state now, so that frees name blocks a replay has and its cache starts near this one:
  // the live blocks as allocations (as long as their pages: the bytes first asked for are not
  // kept), with the other streams recorded on them, then the freed blocks allocated and freed.
  for (const auto& [address, block] : live_) {
    recording_->allocated(address, block->pages.size() * page_, block->stream);
    for (const StreamHandle other : block->used_on) recording_->used(address, other);
  }
  for (const auto& [address, chunk] : small_live_) {
    recording_->allocated(address, chunk.size_class, chunk.stream);
    for (const StreamHandle other : chunk.used_on) recording_->used(address, other);
  }
  for (const auto& [address, block] : freed_) {
    recording_->allocated(address, block->pages.size() * page_, block->stream);
    recording_->freed(address);
  }
}

void PagedDeviceMemory::mark_step() {
  const std::lock_guard lock(mutex_);
  if (!recording_) return;
  const PagedMemoryStats grew = counter_growth(stats_, recorded_since_);
  recording_->step({grew.pages_mapped, grew.reused, grew.grown_blocks, grew.mapped_blocks, grew.taken_blocks,
                    grew.device_waits});
  recorded_since_ = stats_;
}

std::unique_ptr<PagedRecording> PagedDeviceMemory::take_recording() {
  const std::lock_guard lock(mutex_);
  return std::move(recording_);
}

}  // namespace teraio::io
