#include "teraio/io/paged_device_memory.hpp"

#include <algorithm>
#include <bit>

#include "paged_device_memory_parts.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/paged_recording.hpp"  // the hooks in allocate, free and record_use

namespace teraio::io {
namespace {

// Ends a request's copy hold (PagedDeviceMemory::hold_copies) as the request ends, served or not.
class HoldEnds {
 public:
  explicit HoldEnds(std::unique_ptr<CopyHold>& hold) : hold_(hold) {}
  ~HoldEnds() { hold_.reset(); }
  HoldEnds(const HoldEnds&) = delete;
  HoldEnds& operator=(const HoldEnds&) = delete;

 private:
  std::unique_ptr<CopyHold>& hold_;
};

}  // namespace

PagedDeviceMemory::PagedDeviceMemory(PageDriver& driver, std::uint64_t range_lengths)
    : driver_(driver),
      page_(driver.page_bytes()),
      range_lengths_(range_lengths),
      cap_pages_(driver.device_bytes() / driver.page_bytes()) {
  if (range_lengths_ == 0 || range_lengths_ > kLongestRangeLengths)
    throw Error(ErrorKind::kInvalidArgument,
                cat("paged device memory: an address range is 1 to ", kLongestRangeLengths,
                    " times its block's length, got ", range_lengths_));
  if (page_ < kSmallLimit || !std::has_single_bit(page_))
    throw Error(ErrorKind::kInvalidArgument,
                cat("paged device memory needs pages of a power of two of at least ", kSmallLimit,
                    " bytes, got ", page_));
  stats_.page_bytes = page_;
}

PagedDeviceMemory::~PagedDeviceMemory() {
  holder_ = nullptr;  // its copier may be gone already
  try {
    unmap_retired(true);
    auto give_up = [&](const Block& block) {
      DeviceAddress at = block.address;
      std::uint64_t left = block.pages.size();
      unmap(*block.range, at, left);
      for (const PageHandle page : block.pages) driver_.release_page(page);
    };
    for (const auto& [address, block] : freed_) give_up(*block);
    for (const auto& slab : slabs_) give_up(*slab);
    for (const FreePage& free_page : free_pages_) driver_.release_page(free_page.page);
  } catch (const std::exception& e) {
    log::warn("paged device memory: cleanup failed: ", e.what());
  }
}

void PagedDeviceMemory::free_again(std::vector<FreePage>& pages) {
  for (FreePage& page : pages) free_pages_.push_back(std::move(page));
}

void PagedDeviceMemory::note_in_use(std::int64_t delta) {
  stats_.in_use_bytes = static_cast<std::uint64_t>(static_cast<std::int64_t>(stats_.in_use_bytes) + delta);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
}

void PagedDeviceMemory::hold_copies() {
  if (!holder_ || hold_) return;
  const DriverStopwatch timed(stats_.copy_hold_s);
  try {
    hold_ = holder_();
  } catch (const std::exception& e) {
    // A hold only makes the driver's calls cheaper: the request goes on without one, said once.
    if (!hold_failed_)
      log::warn("paged device memory: holding the copies failed, mapping beside them: ", e.what());
    hold_failed_ = true;
    return;
  }
  if (!hold_) return;
  ++stats_.copy_holds;
  if (!hold_->quiet()) ++stats_.copy_holds_not_quiet;
}

void PagedDeviceMemory::hold_copies_with(const void* owner, CopyHolder holder) {
  const std::lock_guard lock(mutex_);
  holder_ = std::move(holder);
  holder_owner_ = holder_ ? owner : nullptr;
}

void PagedDeviceMemory::stop_holding_copies(const void* owner) {
  const std::lock_guard lock(mutex_);
  if (owner != holder_owner_) return;
  holder_ = nullptr;
  holder_owner_ = nullptr;
}

void* PagedDeviceMemory::allocate(std::uint64_t bytes, StreamHandle stream) {
  if (bytes == 0) return nullptr;
  const std::lock_guard lock(mutex_);
  const HoldEnds hold_ends(hold_);
  // With a holder the pages retired are unmapped by the next request that maps, under its hold
  // (take_block): a hold of their own would stop the copies for each few pages.
  if (!holder_) unmap_retired(false);
  void* address = bytes <= kSmallLimit ? allocate_small(bytes, stream)
                                       : allocate_pages((bytes + page_ - 1) / page_, stream);
  ++stats_.allocations;
  if (recording_) recording_->allocated(reinterpret_cast<DeviceAddress>(address), bytes, stream);
  return address;
}

void* PagedDeviceMemory::allocate_small(std::uint64_t bytes, StreamHandle stream) {
  const std::size_t size_class = std::max<std::uint64_t>(kSmallestClass, std::bit_ceil(bytes));
  auto& chunks = small_free_[{stream, size_class}];
  const auto hand_out = [&](DeviceAddress address) {
    small_live_.emplace(address, SmallLive{size_class, stream, {}});
    note_in_use(static_cast<std::int64_t>(size_class));
    ++stats_.small_allocations;
    return reinterpret_cast<void*>(address);
  };
  // The newest chunk first: its marks are the likeliest to be missing (freed on its own stream).
  for (auto chunk = chunks.rbegin(); chunk != chunks.rend(); ++chunk) {
    if (chunk->marks && !all_passed(*chunk->marks)) continue;
    const DeviceAddress address = chunk->address;
    chunks.erase(std::next(chunk).base());
    return hand_out(address);
  }
  // A new slab: one page cut into chunks of this class, kept for this stream and class. Only
  // its chunks handed out count as in use.
  std::unique_ptr<Block> slab = take_block(1, stream);
  const DeviceAddress base = slab->address;
  slabs_.push_back(std::move(slab));
  for (std::uint64_t offset = page_ - size_class; offset > 0; offset -= size_class)
    chunks.push_back(SmallChunk{base + offset, nullptr});
  return hand_out(base);
}

void* PagedDeviceMemory::allocate_pages(std::uint64_t pages, StreamHandle stream) {
  std::unique_ptr<Block> block = take_block(pages, stream);
  const DeviceAddress address = block->address;
  live_.emplace(address, std::move(block));
  note_in_use(static_cast<std::int64_t>(pages * page_));
  return reinterpret_cast<void*>(address);
}

std::unique_ptr<PagedDeviceMemory::Block> PagedDeviceMemory::take_block(std::uint64_t pages,
                                                                        StreamHandle stream) {
  Block* fits = best_cached(pages, stream);
  if (fits == nullptr) {
    // The driver is called from here on (grown or map_new: pages made, mapped, access set), so
    // the copies are held here, for all of it. With a holder the retired pages whose work is
    // done are unmapped first under the same hold, so that their addresses are room to grow into.
    hold_copies();
    if (holder_) unmap_retired(false);
    if (std::unique_ptr<Block> block = grown(pages, stream)) return block;
    return map_new(pages, stream);
  }
  std::unique_ptr<Block> block = detach(fits);
  if (block->pages.size() > pages) {
    cache(cut_tail(*block, pages));
    ++stats_.split_blocks;
  }
  block->marks.reset();
  ++stats_.reused;
  return block;
}

void PagedDeviceMemory::map_into(const std::shared_ptr<Range>& range, DeviceAddress at,
                                 std::vector<FreePage>& got) {
  std::uint64_t mapped = 0;
  try {
    const DriverStopwatch timed(stats_.map_s, &stats_.slow_maps, &stats_.slow_map_s);
    for (; mapped < got.size(); ++mapped) {
      const DeviceAddress address = at + mapped * page_;
      driver_.map(address, got[mapped].page);
      range->slot_mapped[range->slot(address, page_)] = true;
      ++range->mapped;
    }
    const DriverStopwatch access_timed(stats_.access_s);
    driver_.allow_access(at, got.size() * page_);
  } catch (...) {
    // The pages go back free (with the marks they came with) and what was mapped is unmapped:
    // the allocator stays as it was before the request. Pages an undo could not unmap stay
    // retired, for a later call to unmap; free pages may be mapped at retired addresses.
    try {
      for (; mapped > 0; --mapped) {
        const DeviceAddress address = at + (mapped - 1) * page_;
        driver_.unmap(address);
        range->slot_mapped[range->slot(address, page_)] = false;
        --range->mapped;
      }
    } catch (const std::exception& e) {
      log::warn("paged device memory: undoing a failed mapping failed too: ", e.what());
      retired_.push_back(Retired{range, at, mapped, nullptr});
    }
    free_again(got);
    throw;
  }
  stats_.pages_mapped += got.size();
}

std::unique_ptr<PagedDeviceMemory::Block> PagedDeviceMemory::map_new(std::uint64_t pages,
                                                                     StreamHandle stream) {
  std::vector<FreePage> got = gather(pages, stream);
  auto block = std::make_unique<Block>();
  block->stream = stream;
  std::uint64_t slots = range_lengths_ * pages;
  try {
    try {
      block->address = driver_.reserve(slots * page_);
    } catch (const Error&) {
      // The room to grow is a convenience: a range as long as the block will do.
      if (slots == pages) throw;
      slots = pages;
      block->address = driver_.reserve(slots * page_);
    }
  } catch (...) {
    free_again(got);
    throw;
  }
  block->range = std::make_shared<Range>(Range{block->address, slots, 0, std::vector<bool>(slots)});
  try {
    map_into(block->range, block->address, got);
  } catch (...) {
    if (block->range->mapped == 0) {
      block->range->unreserved = true;
      driver_.unreserve(block->address, slots * page_);
    }
    throw;
  }
  block->pages.reserve(pages);
  for (const FreePage& page : got) block->pages.push_back(page.page);
  ++stats_.mapped_blocks;
  return block;
}

bool PagedDeviceMemory::room_after(const Block& block, std::uint64_t pages) const {
  const Range& range = *block.range;
  const std::uint64_t first = range.slot(block.end(page_), page_);
  if (first + pages > range.pages) return false;
  for (std::uint64_t slot = first; slot < first + pages; ++slot)
    if (range.slot_mapped[slot]) return false;
  return true;
}

std::unique_ptr<PagedDeviceMemory::Block> PagedDeviceMemory::grown(std::uint64_t pages, StreamHandle stream) {
  // Only the shortfall is mapped: the largest freed block of the stream that has unmapped room
  // after it in its range grows into it, instead of all its pages being mapped again elsewhere.
  const auto on_stream = cached_.find(stream);
  if (on_stream == cached_.end()) return nullptr;
  Block* base = nullptr;
  for (auto candidate = std::make_reverse_iterator(on_stream->second.lower_bound(pages));
       candidate != on_stream->second.rend(); ++candidate) {
    if (ready_for(*candidate->second->marks, stream) &&
        room_after(*candidate->second, pages - candidate->first)) {
      base = candidate->second;
      break;
    }
  }
  if (base == nullptr) return nullptr;
  std::unique_ptr<Block> block = detach(base);
  try {
    block->pages.reserve(pages);  // so that nothing can throw once the pages are mapped
    // Out of memory here is out of memory for map_new too: the same pages are within reach.
    std::vector<FreePage> got = gather(pages - block->pages.size(), stream);
    map_into(block->range, block->end(page_), got);
    for (const FreePage& page : got) block->pages.push_back(page.page);
  } catch (...) {
    cache(std::move(block));
    throw;
  }
  block->marks.reset();
  ++stats_.grown_blocks;
  return block;
}

PagedDeviceMemory::Block* PagedDeviceMemory::best_cached(std::uint64_t pages, StreamHandle stream) {
  const auto on_stream = cached_.find(stream);
  if (on_stream == cached_.end()) return nullptr;
  // Smallest first; a block whose other streams are still busy is passed over, as the caching
  // allocator passes over a block whose events are pending.
  for (auto candidate = on_stream->second.lower_bound(pages); candidate != on_stream->second.end();
       ++candidate)
    if (ready_for(*candidate->second->marks, stream)) return candidate->second;
  return nullptr;
}

std::unique_ptr<PagedDeviceMemory::Block> PagedDeviceMemory::detach(Block* block) {
  auto& by_size = cached_.at(block->stream);
  auto [first, last] = by_size.equal_range(block->pages.size());
  by_size.erase(std::find_if(first, last, [&](const auto& entry) { return entry.second == block; }));
  cached_pages_ -= block->pages.size();
  auto owned = freed_.extract(block->address);
  return std::move(owned.mapped());
}

void PagedDeviceMemory::cache(std::unique_ptr<Block> block) {
  // A freed neighbour of the same range and stream joins it, so that a later request as long as
  // both is served in place.
  auto join = [&](Block& left, std::unique_ptr<Block> right) {
    auto marks = std::make_shared<Marks>();
    marks->driver = &driver_;
    for (SharedMarks* part : {&left.marks, &right->marks})
      if (*part && !all_passed(**part)) marks->joined.push_back(std::move(*part));
    left.marks = std::move(marks);
    left.pages.insert(left.pages.end(), right->pages.begin(), right->pages.end());
    ++stats_.joined_blocks;
  };
  const auto next = freed_.find(block->end(page_));
  if (next != freed_.end() && next->second->range == block->range && next->second->stream == block->stream)
    join(*block, detach(next->second.get()));
  const auto after = freed_.lower_bound(block->address);
  if (after != freed_.begin()) {
    Block* previous = std::prev(after)->second.get();
    if (previous->end(page_) == block->address && previous->range == block->range &&
        previous->stream == block->stream) {
      std::unique_ptr<Block> left = detach(previous);
      join(*left, std::move(block));
      block = std::move(left);
    }
  }
  Block* raw = block.get();
  cached_[raw->stream].emplace(raw->pages.size(), raw);
  cached_pages_ += raw->pages.size();
  freed_.emplace(raw->address, std::move(block));
}

std::unique_ptr<PagedDeviceMemory::Block> PagedDeviceMemory::cut_tail(Block& block, std::uint64_t keep) {
  auto tail = std::make_unique<Block>();
  tail->range = block.range;
  tail->address = block.address + keep * page_;
  tail->pages.assign(block.pages.begin() + static_cast<std::ptrdiff_t>(keep), block.pages.end());
  block.pages.resize(keep);
  tail->stream = block.stream;
  tail->marks = block.marks;
  return tail;
}

void PagedDeviceMemory::free(void* address) {
  const DeviceAddress key = reinterpret_cast<DeviceAddress>(address);
  const std::lock_guard lock(mutex_);
  if (const auto small = small_live_.find(key); small != small_live_.end()) {
    // Reused only on its own stream, so only the other streams that used it need marks.
    SharedMarks marks = small->second.used_on.empty() ? nullptr : mark_streams(small->second.used_on);
    small_free_[{small->second.stream, small->second.size_class}].push_back(
        SmallChunk{key, std::move(marks)});
    note_in_use(-static_cast<std::int64_t>(small->second.size_class));
    small_live_.erase(small);
    if (recording_) recording_->freed(key);  // once it is back: a failed free is no free
    return;
  }
  const auto live = live_.find(key);
  if (live == live_.end())
    throw Error(ErrorKind::kInvalidArgument,
                cat("paged device memory: free of ", address, ", which it did not hand out"));
  // The block's own stream is marked too: another stream taking its pages, and the unmapping of
  // its addresses, must wait for the work queued on it. Marked before it leaves live_, so that a
  // failing event leaves it there.
  std::vector<StreamHandle> streams{live->second->stream};
  streams.insert(streams.end(), live->second->used_on.begin(), live->second->used_on.end());
  SharedMarks marks = mark_streams(streams);
  std::unique_ptr<Block> block = std::move(live->second);
  live_.erase(live);
  block->used_on.clear();  // its marks cover those streams now
  block->marks = std::move(marks);
  note_in_use(-static_cast<std::int64_t>(block->pages.size() * page_));
  cache(std::move(block));
  if (recording_) recording_->freed(key);
}

bool PagedDeviceMemory::record_use(void* address, StreamHandle stream) {
  const DeviceAddress key = reinterpret_cast<DeviceAddress>(address);
  const std::lock_guard lock(mutex_);
  if (recording_) recording_->used(key, stream);
  auto note = [&](StreamHandle own, std::vector<StreamHandle>& used_on) {
    if (stream != own && std::find(used_on.begin(), used_on.end(), stream) == used_on.end()) {
      used_on.push_back(stream);
      ++stats_.recorded_uses;
    }
  };
  if (const auto small = small_live_.find(key); small != small_live_.end()) {
    note(small->second.stream, small->second.used_on);
    return true;
  }
  const auto live = live_.find(key);
  if (live == live_.end()) return false;
  note(live->second->stream, live->second->used_on);
  return true;
}

void PagedDeviceMemory::set_cap(std::uint64_t bytes) {
  const std::lock_guard lock(mutex_);
  cap_pages_ = bytes / page_;
  device_full_ = false;
}

std::uint64_t PagedDeviceMemory::cap() const {
  const std::lock_guard lock(mutex_);
  return cap_pages_ * page_;
}

void PagedDeviceMemory::empty_cache() {
  const std::lock_guard lock(mutex_);
  const HoldEnds hold_ends(hold_);
  driver_.synchronize();
  hold_copies();  // for the unmapping below
  ++stats_.emptied;
  unmap_retired(true);
  while (!freed_.empty()) {
    // Out of the lists first, its pages free only once all are unmapped: a failure part-way
    // leaves it in neither state twice.
    Block* block = freed_.begin()->second.get();
    std::unique_ptr<Block> owned = detach(block);
    DeviceAddress at = owned->address;
    std::uint64_t left = owned->pages.size();
    const auto pages_free = [&] {
      for (const PageHandle page : owned->pages) free_pages_.push_back(FreePage{page, nullptr});
    };
    try {
      unmap(*owned->range, at, left);
    } catch (...) {
      // The device is idle (synchronized): the pages are free, the rest of the range is
      // unmapped by a later call.
      retired_.push_back(Retired{owned->range, at, left, nullptr});
      pages_free();
      throw;
    }
    pages_free();
  }
  while (!free_pages_.empty()) {
    driver_.release_page(free_pages_.back().page);
    free_pages_.pop_back();
    --pages_held_;
  }
  device_full_ = false;
}

PagedMemoryStats PagedDeviceMemory::stats() const {
  const std::lock_guard lock(mutex_);
  PagedMemoryStats stats = stats_;
  stats.cap_bytes = cap_pages_ * page_;
  stats.held_bytes = pages_held_ * page_;
  return stats;
}

}  // namespace teraio::io
