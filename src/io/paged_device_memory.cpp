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

// Events recorded when a block was freed, one per stream that used it. Shared by the block's
// pages and its retired address range; each event goes back to the driver with the last owner.
struct PagedDeviceMemory::Marks {
  PageDriver* driver = nullptr;
  std::vector<std::pair<StreamHandle, StreamMark>> marks;
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
    for (auto& [stream, blocks] : cached_) {
      for (auto& [pages, block] : blocks) {
        unmap_block(*block);
        for (const PageHandle page : block->pages) driver_.release_page(page);
      }
    }
    for (const auto& slab : slabs_) {
      unmap_block(*slab);
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
    if (chunk->marks && !all_passed(chunk->marks)) continue;
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
  if (auto block = take_cached(pages, stream)) {
    const DeviceAddress address = block->address;
    live_.emplace(address, std::move(block));
    note_in_use(static_cast<std::int64_t>(pages * page_));
    ++stats_.reused;
    return reinterpret_cast<void*>(address);
  }
  auto block = std::make_unique<Block>();
  block->pages = gather(pages, stream);
  block->stream = stream;
  {
    // A failing driver call here is a broken device, not a full one: it is reported as is.
    const Stopwatch timed(stats_.map_s);
    block->address = driver_.reserve(pages * page_);
    for (std::uint64_t i = 0; i < pages; ++i) driver_.map(block->address + i * page_, block->pages[i]);
    driver_.allow_access(block->address, pages * page_);
  }
  stats_.pages_mapped += pages;
  ++stats_.mapped_blocks;
  const DeviceAddress address = block->address;
  live_.emplace(address, std::move(block));
  note_in_use(static_cast<std::int64_t>(pages * page_));
  return reinterpret_cast<void*>(address);
}

std::unique_ptr<PagedDeviceMemory::Block> PagedDeviceMemory::take_cached(std::uint64_t pages,
                                                                         StreamHandle stream) {
  const auto on_stream = cached_.find(stream);
  if (on_stream == cached_.end()) return nullptr;
  auto [first, last] = on_stream->second.equal_range(pages);
  for (auto candidate = first; candidate != last; ++candidate) {
    // Work on the block's own stream is ordered before the new user; other streams must be done.
    const auto& marks = candidate->second->marks->marks;
    const bool ready = std::all_of(marks.begin(), marks.end(), [&](const auto& entry) {
      return entry.first == stream || driver_.passed(entry.second);
    });
    if (!ready) continue;
    std::unique_ptr<Block> block = std::move(candidate->second);
    on_stream->second.erase(candidate);
    block->marks.reset();
    block->used_on.clear();
    return block;
  }
  return nullptr;
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
  // Freed blocks give their pages: this stream's first (stream order covers them), then the
  // others'. Within a stream the smallest block that covers the rest, else the largest.
  std::vector<StreamHandle> order{stream};
  for (const auto& [other, blocks] : cached_)
    if (other != stream) order.push_back(other);
  for (const StreamHandle source : order) {
    const auto on_stream = cached_.find(source);
    if (on_stream == cached_.end()) continue;
    auto& blocks = on_stream->second;
    while (got.size() < pages && !blocks.empty()) {
      auto victim = blocks.lower_bound(pages - got.size());
      if (victim == blocks.end()) victim = std::prev(blocks.end());
      std::unique_ptr<Block> block = std::move(victim->second);
      blocks.erase(victim);
      for (const PageHandle page : block->pages) got.push_back(FreePage{page, block->marks});
      retired_.push_back(Retired{block->address, block->pages.size(), block->marks});
      ++stats_.taken_blocks;
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
  // Pages beyond the request stay free, still tied to the marks of the block they came from.
  while (got.size() > pages) {
    free_pages_.push_back(std::move(got.back()));
    got.pop_back();
  }
  std::vector<PageHandle> handles;
  handles.reserve(pages);
  const Marks* waited = nullptr;
  for (const FreePage& page : got) {
    if (page.marks && page.marks.get() != waited) {
      wait_for(page.marks, stream);
      waited = page.marks.get();
    }
    handles.push_back(page.page);
  }
  return handles;
}

void PagedDeviceMemory::wait_for(const SharedMarks& marks, StreamHandle stream) {
  if (marks->all_passed) return;
  for (const auto& [other, mark] : marks->marks) {
    if (other == stream || driver_.passed(mark)) continue;
    driver_.wait(stream, mark);
    ++stats_.device_waits;
  }
}

PagedDeviceMemory::SharedMarks PagedDeviceMemory::mark_streams(const std::vector<StreamHandle>& streams) {
  auto marks = std::make_shared<Marks>();
  marks->driver = &driver_;
  marks->marks.reserve(streams.size());
  for (const StreamHandle stream : streams) marks->marks.emplace_back(stream, driver_.mark(stream));
  return marks;
}

bool PagedDeviceMemory::all_passed(const SharedMarks& marks) {
  if (!marks->all_passed)
    marks->all_passed = std::all_of(marks->marks.begin(), marks->marks.end(),
                                    [&](const auto& entry) { return driver_.passed(entry.second); });
  return marks->all_passed;
}

void PagedDeviceMemory::unmap_retired(bool everything) {
  std::erase_if(retired_, [&](const Retired& retired) {
    if (!everything && !all_passed(retired.marks)) return false;
    const Stopwatch timed(stats_.unmap_s);
    for (std::uint64_t i = 0; i < retired.pages; ++i) driver_.unmap(retired.address + i * page_);
    driver_.unreserve(retired.address, retired.pages * page_);
    stats_.pages_unmapped += retired.pages;
    return true;
  });
}

void PagedDeviceMemory::unmap_block(const Block& block) {
  const Stopwatch timed(stats_.unmap_s);
  for (std::size_t i = 0; i < block.pages.size(); ++i) driver_.unmap(block.address + i * page_);
  driver_.unreserve(block.address, block.pages.size() * page_);
  stats_.pages_unmapped += block.pages.size();
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
  const std::uint64_t pages = block->pages.size();
  cached_[block->stream].emplace(pages, std::move(block));
}

void PagedDeviceMemory::record_use(void* address, StreamHandle stream) {
  const DeviceAddress key = reinterpret_cast<DeviceAddress>(address);
  const std::lock_guard lock(mutex_);
  auto note = [&](StreamHandle own, std::vector<StreamHandle>& used_on) {
    if (stream != own && std::find(used_on.begin(), used_on.end(), stream) == used_on.end())
      used_on.push_back(stream);
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
  for (auto& [stream, blocks] : cached_) {
    for (auto& [pages, block] : blocks) {
      unmap_block(*block);
      for (const PageHandle page : block->pages) free_pages_.push_back(FreePage{page, nullptr});
    }
  }
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
