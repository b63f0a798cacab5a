#include "teraio/io/paged_device_memory.hpp"

#include <algorithm>
#include <bit>
#include <chrono>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {
namespace {

// Adds the seconds from its construction to its end to `total`.
class Stopwatch {
 public:
  explicit Stopwatch(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

// Events recorded when a block was freed, one per stream that used it, and the marks of freed
// neighbours joined to it. Shared by the parts of a block cut in two and by its pages taken;
// each event goes back to the driver with the last owner.
struct PagedDeviceMemory::Marks {
  PageDriver* driver = nullptr;
  std::vector<std::pair<StreamHandle, StreamMark>> marks;
  std::vector<SharedMarks> joined;
  bool all_passed = false;
  Marks() = default;
  Marks(const Marks&) = delete;
  Marks& operator=(const Marks&) = delete;
  ~Marks() {
    for (const auto& entry : marks) driver->drop(entry.second);
  }
};

PagedDeviceMemory::PagedDeviceMemory(PageDriver& driver)
    : driver_(driver), page_(driver.page_bytes()), cap_pages_(driver.device_bytes() / driver.page_bytes()) {
  if (page_ < kSmallLimit || !std::has_single_bit(page_))
    throw Error(ErrorKind::kInvalidArgument,
                cat("paged device memory needs pages of a power of two of at least ", kSmallLimit,
                    " bytes, got ", page_));
  stats_.page_bytes = page_;
}

PagedDeviceMemory::~PagedDeviceMemory() {
  try {
    unmap_retired(true);
    for (auto& [address, block] : freed_) {
      unmap(block->range, block->address, block->pages.size());
      for (const PageHandle page : block->pages) driver_.release_page(page);
    }
    for (const auto& slab : slabs_) {
      unmap(slab->range, slab->address, slab->pages.size());
      for (const PageHandle page : slab->pages) driver_.release_page(page);
    }
    for (const FreePage& free_page : free_pages_) driver_.release_page(free_page.page);
  } catch (const std::exception& e) {
    log::warn("paged device memory: cleanup failed: ", e.what());
  }
}

void PagedDeviceMemory::note_in_use(std::int64_t delta) {
  stats_.in_use_bytes = static_cast<std::uint64_t>(static_cast<std::int64_t>(stats_.in_use_bytes) + delta);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
}

void* PagedDeviceMemory::allocate(std::uint64_t bytes, StreamHandle stream) {
  if (bytes == 0) return nullptr;
  const std::lock_guard lock(mutex_);
  unmap_retired(false);
  void* address = bytes <= kSmallLimit ? allocate_small(bytes, stream)
                                       : allocate_pages((bytes + page_ - 1) / page_, stream);
  ++stats_.allocations;
  return address;
}

void* PagedDeviceMemory::allocate_small(std::uint64_t bytes, StreamHandle stream) {
  const std::size_t size_class = std::max<std::uint64_t>(kSmallestClass, std::bit_ceil(bytes));
  auto& chunks = small_free_[{stream, size_class}];
  // The newest chunk first: its marks are the likeliest to be missing (freed on its own stream).
  for (auto chunk = chunks.rbegin(); chunk != chunks.rend(); ++chunk) {
    if (chunk->marks && !all_passed(*chunk->marks)) continue;
    const DeviceAddress address = chunk->address;
    chunks.erase(std::next(chunk).base());
    small_live_.emplace(address, SmallLive{size_class, stream, {}});
    note_in_use(static_cast<std::int64_t>(size_class));
    ++stats_.small_allocations;
    return reinterpret_cast<void*>(address);
  }
  // A new slab: one page cut into chunks of this class, kept for this stream and class.
  void* slab_address = allocate_pages(1, stream);
  auto slab = live_.extract(reinterpret_cast<DeviceAddress>(slab_address));
  note_in_use(-static_cast<std::int64_t>(page_));
  slabs_.push_back(std::move(slab.mapped()));
  const DeviceAddress base = reinterpret_cast<DeviceAddress>(slab_address);
  for (std::uint64_t offset = page_ - size_class; offset > 0; offset -= size_class)
    chunks.push_back(SmallChunk{base + offset, nullptr});
  small_live_.emplace(base, SmallLive{size_class, stream, {}});
  note_in_use(static_cast<std::int64_t>(size_class));
  ++stats_.small_allocations;
  return slab_address;
}

void* PagedDeviceMemory::allocate_pages(std::uint64_t pages, StreamHandle stream) {
  std::unique_ptr<Block> block;
  if (Block* fits = best_cached(pages, stream)) {
    block = detach(fits);
    if (block->pages.size() > pages) {
      cache(cut_tail(*block, pages));
      ++stats_.split_blocks;
    }
    block->marks.reset();
    block->used_on.clear();
    ++stats_.reused;
  } else {
    block = std::make_unique<Block>();
    block->pages = gather(pages, stream);
    block->stream = stream;
    // A failing driver call here is a broken device, not a full one: it is reported as is.
    const Stopwatch timed(stats_.map_s);
    block->address = driver_.reserve(pages * page_);
    block->range = std::make_shared<Range>(Range{block->address, pages, 0});
    for (std::uint64_t i = 0; i < pages; ++i) driver_.map(block->address + i * page_, block->pages[i]);
    block->range->mapped = pages;
    driver_.allow_access(block->address, pages * page_);
    stats_.pages_mapped += pages;
    ++stats_.mapped_blocks;
  }
  const DeviceAddress address = block->address;
  live_.emplace(address, std::move(block));
  note_in_use(static_cast<std::int64_t>(pages * page_));
  return reinterpret_cast<void*>(address);
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
  freed_.emplace(raw->address, std::move(block));
}

std::unique_ptr<PagedDeviceMemory::Block> PagedDeviceMemory::cut_tail(Block& block, std::uint64_t keep) {
  auto tail = std::make_unique<Block>();
  tail->range = block.range;
  tail->address = block.address + keep * page_;
  tail->pages.assign(block.pages.begin() + static_cast<std::ptrdiff_t>(keep), block.pages.end());
  block.pages.resize(keep);
  tail->stream = block.stream;
  tail->used_on = block.used_on;
  tail->marks = block.marks;
  return tail;
}

std::vector<PageHandle> PagedDeviceMemory::gather(std::uint64_t pages, StreamHandle stream) {
  std::vector<FreePage> got;
  got.reserve(pages);
  while (got.size() < pages && !free_pages_.empty()) {
    got.push_back(std::move(free_pages_.back()));
    free_pages_.pop_back();
  }
  while (got.size() < pages && pages_held_ < cap_pages_ && !device_full_) {
    const std::optional<PageHandle> page = driver_.create_page();
    if (!page) {
      device_full_ = true;
      break;
    }
    ++pages_held_;
    stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, pages_held_ * page_);
    got.push_back(FreePage{*page, nullptr});
  }
  // Freed blocks give pages from their ends: this stream's first (stream order covers them), then
  // the others'. Within a stream the smallest block that covers the rest, else the largest.
  std::vector<StreamHandle> order{stream};
  for (const auto& [other, blocks] : cached_)
    if (other != stream) order.push_back(other);
  for (const StreamHandle source : order) {
    const auto on_stream = cached_.find(source);
    if (on_stream == cached_.end()) continue;
    auto& blocks = on_stream->second;
    while (got.size() < pages && !blocks.empty()) {
      const std::uint64_t wanted = pages - got.size();
      auto victim = blocks.lower_bound(wanted);
      if (victim == blocks.end()) victim = std::prev(blocks.end());
      std::unique_ptr<Block> block = detach(victim->second);
      if (block->pages.size() > wanted) {
        std::unique_ptr<Block> tail = cut_tail(*block, block->pages.size() - wanted);
        cache(std::move(block));
        ++stats_.split_blocks;
        block = std::move(tail);
      }
      retire(std::move(block), got);
    }
  }
  if (got.size() < pages) {
    for (FreePage& page : got) free_pages_.push_back(std::move(page));
    ++stats_.out_of_memory;
    throw Error(
        ErrorKind::kOutOfMemory,
        cat("paged device memory: no room for ", format_bytes(pages * page_), " (",
            format_bytes(stats_.in_use_bytes), " in use, ", format_bytes(pages_held_ * page_), " held, cap ",
            format_bytes(cap_pages_ * page_), device_full_ ? ", the device refused more pages" : "", ")"));
  }
  std::vector<PageHandle> handles;
  handles.reserve(pages);
  const Marks* waited = nullptr;
  for (const FreePage& page : got) {
    if (page.marks && page.marks.get() != waited) {
      wait_for(*page.marks, stream);
      waited = page.marks.get();
    }
    handles.push_back(page.page);
  }
  return handles;
}

void PagedDeviceMemory::retire(std::unique_ptr<Block> block, std::vector<FreePage>& got) {
  for (const PageHandle page : block->pages) got.push_back(FreePage{page, block->marks});
  retired_.push_back(Retired{block->range, block->address, block->pages.size(), block->marks});
  ++stats_.taken_blocks;
}

bool PagedDeviceMemory::ready_for(const Marks& marks, StreamHandle stream) {
  if (marks.all_passed) return true;
  for (const auto& [other, mark] : marks.marks)
    if (other != stream && !driver_.passed(mark)) return false;
  return std::all_of(marks.joined.begin(), marks.joined.end(),
                     [&](const SharedMarks& part) { return ready_for(*part, stream); });
}

void PagedDeviceMemory::wait_for(const Marks& marks, StreamHandle stream) {
  if (marks.all_passed) return;
  for (const auto& [other, mark] : marks.marks) {
    if (other == stream || driver_.passed(mark)) continue;
    driver_.wait(stream, mark);
    ++stats_.device_waits;
  }
  for (const SharedMarks& part : marks.joined) wait_for(*part, stream);
}

PagedDeviceMemory::SharedMarks PagedDeviceMemory::mark_streams(const std::vector<StreamHandle>& streams) {
  auto marks = std::make_shared<Marks>();
  marks->driver = &driver_;
  marks->marks.reserve(streams.size());
  for (const StreamHandle stream : streams) marks->marks.emplace_back(stream, driver_.mark(stream));
  return marks;
}

bool PagedDeviceMemory::all_passed(Marks& marks) {
  if (!marks.all_passed)
    marks.all_passed = std::all_of(marks.marks.begin(), marks.marks.end(),
                                   [&](const auto& entry) { return driver_.passed(entry.second); }) &&
                       std::all_of(marks.joined.begin(), marks.joined.end(),
                                   [&](const SharedMarks& part) { return all_passed(*part); });
  return marks.all_passed;
}

void PagedDeviceMemory::unmap(const std::shared_ptr<Range>& range, DeviceAddress address,
                              std::uint64_t pages) {
  const Stopwatch timed(stats_.unmap_s);
  for (std::uint64_t i = 0; i < pages; ++i) driver_.unmap(address + i * page_);
  stats_.pages_unmapped += pages;
  range->mapped -= pages;
  if (range->mapped == 0) driver_.unreserve(range->address, range->pages * page_);
}

void PagedDeviceMemory::unmap_retired(bool everything) {
  std::erase_if(retired_, [&](const Retired& retired) {
    if (!everything && retired.marks && !all_passed(*retired.marks)) return false;
    unmap(retired.range, retired.address, retired.pages);
    return true;
  });
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
    return;
  }
  const auto live = live_.find(key);
  if (live == live_.end())
    throw Error(ErrorKind::kInvalidArgument,
                cat("paged device memory: free of ", address, ", which it did not hand out"));
  std::unique_ptr<Block> block = std::move(live->second);
  live_.erase(live);
  // The block's own stream is marked too: another stream taking its pages, and the unmapping of
  // its addresses, must wait for the work queued on it.
  block->used_on.insert(block->used_on.begin(), block->stream);
  block->marks = mark_streams(block->used_on);
  note_in_use(-static_cast<std::int64_t>(block->pages.size() * page_));
  cache(std::move(block));
}

void PagedDeviceMemory::record_use(void* address, StreamHandle stream) {
  const DeviceAddress key = reinterpret_cast<DeviceAddress>(address);
  const std::lock_guard lock(mutex_);
  auto note = [&](StreamHandle own, std::vector<StreamHandle>& used_on) {
    if (stream != own && std::find(used_on.begin(), used_on.end(), stream) == used_on.end()) {
      used_on.push_back(stream);
      ++stats_.recorded_uses;
    }
  };
  if (const auto small = small_live_.find(key); small != small_live_.end()) {
    note(small->second.stream, small->second.used_on);
    return;
  }
  const auto live = live_.find(key);
  if (live == live_.end())
    throw Error(ErrorKind::kInvalidArgument,
                cat("paged device memory: a stream recorded on ", address, ", which it did not hand out"));
  note(live->second->stream, live->second->used_on);
}

void PagedDeviceMemory::set_cap(std::uint64_t bytes) {
  const std::lock_guard lock(mutex_);
  cap_pages_ = (bytes == 0 ? driver_.device_bytes() : bytes) / page_;
  device_full_ = false;
}

std::uint64_t PagedDeviceMemory::cap() const {
  const std::lock_guard lock(mutex_);
  return cap_pages_ * page_;
}

void PagedDeviceMemory::empty_cache() {
  const std::lock_guard lock(mutex_);
  driver_.synchronize();
  ++stats_.emptied;
  unmap_retired(true);
  for (auto& [address, block] : freed_) {
    unmap(block->range, block->address, block->pages.size());
    for (const PageHandle page : block->pages) free_pages_.push_back(FreePage{page, nullptr});
  }
  freed_.clear();
  cached_.clear();
  for (const FreePage& free_page : free_pages_) driver_.release_page(free_page.page);
  pages_held_ -= free_pages_.size();
  free_pages_.clear();
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
