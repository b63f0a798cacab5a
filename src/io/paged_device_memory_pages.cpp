// PagedDeviceMemory, the pages' half: where a request's pages come from (pages freed, made anew,
// or taken from freed blocks), the stream marks that say when a freed block's pages are free of
// their work, and the unmapping of the old addresses of pages taken.
#include <algorithm>

#include "paged_device_memory_parts.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {

Error PagedDeviceMemory::no_room(std::uint64_t pages, std::string_view why) {
  ++stats_.out_of_memory;
  return Error(ErrorKind::kOutOfMemory,
               cat("paged device memory: no room for ", format_bytes(pages * page_), " (",
                   format_bytes(stats_.in_use_bytes), " in use, ", format_bytes(pages_held_ * page_),
                   " held, cap ", format_bytes(cap_pages_ * page_), why, ")"));
}

std::vector<PagedDeviceMemory::FreePage> PagedDeviceMemory::gather(std::uint64_t pages, StreamHandle stream) {
  // A request that cannot be met is refused before any freed block is taken apart: the blocks
  // stay whole for the requests that follow (TeraIO moves tensors out and asks again).
  const std::uint64_t creatable = pages_held_ < cap_pages_ ? cap_pages_ - pages_held_ : 0;
  if (free_pages_.size() + creatable + cached_pages_ < pages) throw no_room(pages, "");
  std::vector<FreePage> got;
  got.reserve(pages);
  while (got.size() < pages && !free_pages_.empty()) {
    got.push_back(std::move(free_pages_.back()));
    free_pages_.pop_back();
  }
  try {
    while (got.size() < pages && pages_held_ < cap_pages_ && !device_full_) {
      const std::optional<PageHandle> page = driver_.create_page();
      if (!page) {
        device_full_ = true;  // until this request is done: memory may come free meanwhile
        break;
      }
      ++pages_held_;
      stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, pages_held_ * page_);
      got.push_back(FreePage{*page, nullptr});
    }
    const bool refused = device_full_;
    device_full_ = false;
    if (refused && got.size() + cached_pages_ < pages)
      throw no_room(pages, ", the device refused more pages");
    take_from_freed(pages, stream, got);
  } catch (...) {
    free_again(got);
    throw;
  }
  return got;
}

void PagedDeviceMemory::take_from_freed(std::uint64_t pages, StreamHandle stream,
                                        std::vector<FreePage>& got) {
  // Freed blocks give pages from their ends: this stream's first (stream order covers them), then
  // the others'. Within a stream the smallest blocks first, whole, the last one cut to what is
  // still wanted: the large freed blocks stay whole for large requests, which on W3 come back
  // every micro-batch (its 1-2 GiB loss tensors). Session 43's recording of W3 replayed so maps
  // 3 750-4 400 pages a step, against 5 900-8 300 taking the smallest block that covers the rest,
  // else the largest (bench/RESULTS.md).
  std::vector<StreamHandle> order{stream};
  for (const auto& [other, blocks] : cached_)
    if (other != stream) order.push_back(other);
  for (const StreamHandle source : order) {
    const auto on_stream = cached_.find(source);
    if (on_stream == cached_.end()) continue;
    auto& blocks = on_stream->second;
    while (got.size() < pages && !blocks.empty()) {
      const std::uint64_t wanted = pages - got.size();
      std::unique_ptr<Block> block = detach(blocks.begin()->second);
      if (block->pages.size() > wanted) {
        std::unique_ptr<Block> tail = cut_tail(*block, block->pages.size() - wanted);
        cache(std::move(block));
        ++stats_.split_blocks;
        block = std::move(tail);
      }
      retire(std::move(block), got);
    }
  }
  const Marks* waited = nullptr;
  for (const FreePage& page : got) {
    if (page.marks && page.marks.get() != waited) {
      wait_for(*page.marks, stream);
      waited = page.marks.get();
    }
  }
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

void PagedDeviceMemory::unmap(Range& range, DeviceAddress& address, std::uint64_t& pages) {
  // Progress is recorded page by page, so that a driver call failing part-way is not repeated
  // on pages already unmapped; a range whose unreserve failed is unreserved by a later call.
  const DriverStopwatch timed(stats_.unmap_s, &stats_.slow_unmaps, &stats_.slow_unmap_s);
  for (; pages > 0; --pages, address += page_) {
    driver_.unmap(address);
    range.slot_mapped[range.slot(address, page_)] = false;
    --range.mapped;
    ++stats_.pages_unmapped;
  }
  if (range.mapped == 0 && !range.unreserved) {
    driver_.unreserve(range.address, range.pages * page_);
    range.unreserved = true;
  }
}

void PagedDeviceMemory::unmap_retired(bool everything) {
  // Oldest first, up to the first whose work is not done: blocks are retired in the order they
  // were taken and their marks pass about in that order, so a look at the oldest says whether
  // there is anything to do. Every request looks (without a copy holder), and W3 retires ~1 300
  // blocks a step while the host runs ahead of the device: a look at each would query hundreds
  // of events a request. A younger entry whose work is done waits behind the oldest; unmapping
  // later is always safe.
  while (!retired_.empty()) {
    Retired& oldest = retired_.front();
    if (!everything && oldest.marks && !all_passed(*oldest.marks)) return;
    unmap(*oldest.range, oldest.address, oldest.pages);
    retired_.pop_front();
  }
}

}  // namespace teraio::io
