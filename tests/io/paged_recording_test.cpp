// io/paged_recording: requests kept as served, written and read back, and replayed on the
// counting driver with what each policy input (page, cap, lag) changes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "teraio/core/error.hpp"
#include "teraio/io/paged_recording.hpp"
#include "teraio/io/paged_replay.hpp"

namespace teraio::io {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kPage = 2 * kMiB;

StreamHandle stream(std::uintptr_t n) {
  return reinterpret_cast<StreamHandle>(n);
}

// Requests as the allocator would report them, at made-up addresses.
PagedRecording recorded(std::uint64_t cap, std::initializer_list<PagedRequest> requests) {
  PagedRecording recording(kPage, cap);
  for (const PagedRequest& r : requests) {
    const DeviceAddress address = 0x1000 * r.block;
    switch (r.kind) {
      case PagedRequest::Kind::kAllocate: recording.allocated(address, r.bytes, stream(r.stream + 1)); break;
      case PagedRequest::Kind::kFree: recording.freed(address); break;
      case PagedRequest::Kind::kUse: recording.used(address, stream(r.stream + 1)); break;
      case PagedRequest::Kind::kStep: recording.step({}); break;
    }
  }
  return recording;
}

PagedRequest allocate(std::uint64_t block, std::uint64_t bytes, std::uint32_t on = 0) {
  return {PagedRequest::Kind::kAllocate, block, bytes, on};
}
PagedRequest free_of(std::uint64_t block) {
  return {PagedRequest::Kind::kFree, block, 0, 0};
}
PagedRequest use(std::uint64_t block, std::uint32_t on) {
  return {PagedRequest::Kind::kUse, block, 0, on};
}
const PagedRequest kStep{PagedRequest::Kind::kStep, 0, 0, 0};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("teraio-paged-" + name)).string();
}

TEST(PagedRecording, NumbersBlocksAndStreamsInOrderOfFirstSightAndLeavesOutUnknownAddresses) {
  PagedRecording recording(kPage, 8 * kPage);
  recording.freed(0x99);  // allocated before the recording began: not a request it can name
  recording.allocated(0x10, 3 * kMiB, stream(7));
  recording.allocated(0x20, kMiB, stream(3));
  recording.used(0x10, stream(3));
  recording.freed(0x10);
  recording.used(0x10, stream(7));  // freed meanwhile: left out
  recording.step({});
  recording.allocated(0x10, kMiB, stream(7));  // the address again: a new block
  const auto& r = recording.requests();
  ASSERT_EQ(r.size(), 6U);
  EXPECT_EQ(r[0].kind, PagedRequest::Kind::kAllocate);
  EXPECT_EQ(r[0].block, 1U);
  EXPECT_EQ(r[0].bytes, 3 * kMiB);
  EXPECT_EQ(r[0].stream, 0U);
  EXPECT_EQ(r[1].stream, 1U);
  EXPECT_EQ(r[2].kind, PagedRequest::Kind::kUse);
  EXPECT_EQ(r[2].block, 1U);
  EXPECT_EQ(r[2].stream, 1U);
  EXPECT_EQ(r[3].kind, PagedRequest::Kind::kFree);
  EXPECT_EQ(r[4].kind, PagedRequest::Kind::kStep);
  EXPECT_EQ(r[5].block, 3U);
  EXPECT_EQ(r[5].stream, 0U);
}

TEST(PagedRecording, WritesAndReadsBackTheSameRequests) {
  const PagedRecording recording = recorded(
      8 * kPage, {allocate(1, 3 * kMiB), allocate(2, kMiB, 1), use(1, 1), free_of(1), kStep, free_of(2)});
  const std::string path = temp_path("roundtrip.txt");
  recording.write(path);
  const PagedRecording back = PagedRecording::read(path);
  std::filesystem::remove(path);
  EXPECT_EQ(back.page_bytes(), kPage);
  EXPECT_EQ(back.cap_bytes(), 8 * kPage);
  ASSERT_EQ(back.requests().size(), recording.requests().size());
  for (std::size_t i = 0; i < back.requests().size(); ++i) {
    const PagedRequest& a = recording.requests()[i];
    const PagedRequest& b = back.requests()[i];
    EXPECT_EQ(a.kind, b.kind) << i;
    EXPECT_EQ(a.block, b.block) << i;
    EXPECT_EQ(a.bytes, b.bytes) << i;
    EXPECT_EQ(a.stream, b.stream) << i;
  }
}

TEST(PagedRecording, AStepKeepsTheAllocatorsCountsThroughTheFile) {
  PagedRecording recording(kPage, 8 * kPage);
  recording.allocated(0x10, kMiB, stream(1));
  recording.step({7, 6, 5, 4, 3, 2});
  const std::string path = temp_path("counts.txt");
  recording.write(path);
  {
    std::ofstream more(path, std::ios::app);
    more << "s\n";  // a mark without counts
  }
  const PagedRecording back = PagedRecording::read(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.counted().size(), 2U);
  ASSERT_TRUE(back.counted()[0].has_value());
  const RecordedCounts& c = *back.counted()[0];
  EXPECT_EQ(c.pages_mapped, 7U);
  EXPECT_EQ(c.reused, 6U);
  EXPECT_EQ(c.grown_blocks, 5U);
  EXPECT_EQ(c.mapped_blocks, 4U);
  EXPECT_EQ(c.taken_blocks, 3U);
  EXPECT_EQ(c.device_waits, 2U);
  EXPECT_FALSE(back.counted()[1].has_value());
  // The replay hands each step the allocator's own counts beside its own.
  const auto steps = replay(back, {});
  ASSERT_EQ(steps.size(), 2U);
  ASSERT_TRUE(steps[0].recorded.has_value());
  EXPECT_EQ(steps[0].recorded->pages_mapped, 7U);
  EXPECT_EQ(steps[0].counts.pages_mapped, 1U);
  EXPECT_FALSE(steps[1].recorded.has_value());
}

TEST(PagedRecording, AMalformedFileIsRefusedWithItsLine) {
  const std::string path = temp_path("bad.txt");
  {
    std::ofstream out(path);
    out << "# teraio paged requests v1 page=2097152 cap=16777216\na 1 4096 0\nf\n";
  }
  try {
    PagedRecording::read(path);
    ADD_FAILURE() << "read a malformed file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find(":3: not a paged request: 'f'"), std::string::npos) << e.what();
  }
  // Numbers are digits only, lines hold nothing more, the header nothing else.
  for (const char* text : {"page,cap\n", "# teraio paged requests v1 page=2097152 cap=16777216 more\n",
                           "# teraio paged requests v1 page=2097152 cap=16777216\na -1 4096 0\n",
                           "# teraio paged requests v1 page=2097152 cap=16777216\nf 1 2\n",
                           "# teraio paged requests v1 page=2097152 cap=16777216\ns pages=1\n",
                           "# teraio paged requests v1 page=2097152 cap=16777216\nu 1 99999999999\n"}) {
    {
      std::ofstream out(path);
      out << text;
    }
    EXPECT_THROW(PagedRecording::read(path), Error) << text;
  }
  std::filesystem::remove(path);
  EXPECT_THROW(PagedRecording::read(path), Error);  // gone
}

TEST(PagedReplay, ABlockFreedAndAskedForAgainOnItsStreamIsReusedWithoutMapping) {
  const auto steps =
      replay(recorded(8 * kPage, {allocate(1, 4 * kMiB), free_of(1), kStep, allocate(2, 4 * kMiB), free_of(2),
                                  kStep, allocate(3, 3 * kMiB)}),
             {});
  ASSERT_EQ(steps.size(), 2U);  // the requests after the last mark are left out
  EXPECT_EQ(steps[0].counts.allocations, 1U);
  EXPECT_EQ(steps[0].counts.pages_mapped, 2U);
  EXPECT_EQ(steps[1].counts.allocations, 1U);
  EXPECT_EQ(steps[1].counts.reused, 1U);
  EXPECT_EQ(steps[1].counts.pages_mapped, 0U);
  EXPECT_EQ(steps[1].refused, 0U);
}

TEST(PagedReplay, AtTheCapAnotherStreamTakesTheFreedPagesAndWaitsOnlyForADeviceBehind) {
  // Two pages under the cap: the second stream's block must take the first's pages.
  const PagedRecording recording =
      recorded(2 * kPage, {allocate(1, 4 * kMiB), free_of(1), allocate(2, 4 * kMiB, 1), kStep});
  const auto keeping_up = replay(recording, {});
  ASSERT_EQ(keeping_up.size(), 1U);
  EXPECT_EQ(keeping_up[0].counts.taken_blocks, 1U);
  EXPECT_EQ(keeping_up[0].counts.pages_mapped, 4U);
  EXPECT_EQ(keeping_up[0].counts.pages_unmapped, 0U);  // unmapped at the next request, once passed
  EXPECT_EQ(keeping_up[0].counts.device_waits, 0U);
  const auto behind = replay(recording, {.lag = 100});
  EXPECT_EQ(behind[0].counts.taken_blocks, 1U);
  EXPECT_EQ(behind[0].counts.device_waits, 1U);  // the freed block's stream had not got there
}

TEST(PagedReplay, ABiggerPageOrASmallerCapChangesWhatTheSameRequestsCost) {
  const PagedRecording recording =
      recorded(8 * kPage, {allocate(1, 6 * kMiB), allocate(2, 6 * kMiB), free_of(1), free_of(2), kStep});
  EXPECT_EQ(replay(recording, {})[0].counts.pages_mapped, 6U);
  const auto bigger = replay(recording, {.page_bytes = 4 * kMiB});
  EXPECT_EQ(bigger[0].counts.pages_mapped, 4U);  // 6 MiB rounds up to two 4 MiB pages
  const auto smaller = replay(recording, {.cap_bytes = 4 * kPage});
  EXPECT_EQ(smaller[0].refused, 1U);  // three pages each, four under the cap
  EXPECT_EQ(smaller[0].counts.pages_mapped, 3U);
}

TEST(PagedReplay, LongerAddressRangesLetAFreedBlockGrowWhereShorterOnesMapItAnew) {
  // 2 pages, freed, then 5: a range twice as long as 2 pages has no room for 5.
  const PagedRecording recording =
      recorded(16 * kPage, {allocate(1, 2 * kPage), free_of(1), kStep, allocate(2, 5 * kPage), kStep});
  const auto twice = replay(recording, {.range_lengths = 2});
  ASSERT_EQ(twice.size(), 2U);
  EXPECT_EQ(twice[1].counts.grown_blocks, 0U);
  EXPECT_EQ(twice[1].counts.pages_mapped, 5U);
  const auto by_default = replay(recording, {});  // PagedDeviceMemory::kRangeLengths, 8
  EXPECT_EQ(by_default[1].counts.grown_blocks, 1U);
  EXPECT_EQ(by_default[1].counts.pages_mapped, 3U);
  EXPECT_EQ(resolved({}, recording).range_lengths, PagedDeviceMemory::kRangeLengths);
}

TEST(PagedReplay, RequestsThatContradictThemselvesAreRefused) {
  PagedRecording recording(kPage, 8 * kPage);
  const std::string path = temp_path("contradiction.txt");
  {
    std::ofstream out(path);
    out << "# teraio paged requests v1 page=2097152 cap=16777216\nf 4\ns\n";
  }
  const PagedRecording freed_first = PagedRecording::read(path);
  std::filesystem::remove(path);
  try {
    replay(freed_first, {});
    ADD_FAILURE() << "replayed a free of a block never allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
  }
  EXPECT_THROW(replay(recording, {.page_bytes = 3 * kMiB}), Error);  // not a power of two
  EXPECT_THROW(replay(recording, {.cap_bytes = kMiB}), Error);       // under a page
}

}  // namespace
}  // namespace teraio::io
