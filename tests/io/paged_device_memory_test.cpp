// PagedDeviceMemory against a fake driver that checks every mapping and records every wait.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "teraio/core/error.hpp"
#include "teraio/io/paged_device_memory.hpp"
#include "teraio/io/paged_recording.hpp"

namespace teraio::io {
namespace {

constexpr std::uint64_t kPage = std::uint64_t{2} << 20;
// The tests' address ranges are twice a block's first length, as their comments count slots (the
// default, PagedDeviceMemory::kRangeLengths, has its own test).
constexpr std::uint64_t kRanges = 2;

class FakePageDriver final : public PageDriver {
 public:
  explicit FakePageDriver(std::uint64_t device_pages, std::uint64_t page = kPage)
      : device_pages_(device_pages), page_(page) {}
  ~FakePageDriver() override { EXPECT_EQ(live_marks_, 0) << "events not given back"; }

  std::uint64_t page_bytes() const override { return page_; }
  std::uint64_t device_bytes() const override { return device_pages_ * page_; }
  std::optional<PageHandle> create_page() override {
    note_hold();
    if (pages_.size() >= device_pages_) return std::nullopt;
    pages_.insert(++last_page_);
    return last_page_;
  }
  void release_page(PageHandle page) override {
    EXPECT_EQ(pages_.erase(page), 1U) << "released a page twice";
  }
  DeviceAddress reserve(std::uint64_t bytes) override {
    if (bytes > largest_reserve) throw Error(ErrorKind::kCuda, "injected: no address range that long");
    const DeviceAddress address = next_address_;
    next_address_ += bytes + page_;  // a gap, so that neighbours never look contiguous
    reserved_[address] = bytes;
    return address;
  }
  void unreserve(DeviceAddress address, std::uint64_t bytes) override {
    fail_if(fail_unreserve_in);
    EXPECT_EQ(reserved_[address], bytes);
    for (DeviceAddress at = address; at < address + bytes; at += page_)
      EXPECT_FALSE(mapped_.contains(at)) << "address range freed while mapped";
    reserved_.erase(address);
  }
  void map(DeviceAddress address, PageHandle page) override {
    note_hold();
    fail_if(fail_map_in);
    EXPECT_TRUE(pages_.contains(page)) << "mapped a page that does not exist";
    EXPECT_FALSE(mapped_.contains(address)) << "mapped twice at one address";
    mapped_[address] = page;
  }
  void unmap(DeviceAddress address) override {
    note_hold();
    std::this_thread::sleep_for(unmap_delay);
    fail_if(fail_unmap_in);
    EXPECT_EQ(mapped_.erase(address), 1U) << "unmapped twice";
  }
  void allow_access(DeviceAddress address, std::uint64_t bytes) override {
    note_hold();
    std::this_thread::sleep_for(access_delay);
    for (DeviceAddress at = address; at < address + bytes; at += page_)
      EXPECT_TRUE(mapped_.contains(at)) << "access set on an unmapped page";
  }
  StreamMark mark(StreamHandle stream) override {
    fail_if(fail_mark_in);
    ++live_marks_;
    const auto id = ++last_mark_;
    stream_of_[id] = stream;
    if (held_.contains(stream)) pending_.insert(id);
    return reinterpret_cast<StreamMark>(id);
  }
  bool passed(StreamMark mark) override {
    ++passed_calls;
    return !pending_.contains(reinterpret_cast<std::uintptr_t>(mark));
  }
  void wait(StreamHandle stream, StreamMark mark) override {
    waits.emplace_back(stream, stream_of_.at(reinterpret_cast<std::uintptr_t>(mark)));
  }
  void drop(StreamMark /*mark*/) noexcept override { --live_marks_; }
  void synchronize() override {
    pending_.clear();
    ++synchronized;
  }

  // Marks recorded on the stream from now on stay unpassed until finish(stream).
  void hold(StreamHandle stream) { held_.insert(stream); }
  void finish(StreamHandle stream) {
    held_.erase(stream);
    std::erase_if(pending_, [&](std::uintptr_t id) { return stream_of_.at(id) == stream; });
  }
  PageHandle page_at(void* address) const { return mapped_.at(reinterpret_cast<DeviceAddress>(address)); }
  bool mapped_at(DeviceAddress address) const { return mapped_.contains(address); }
  std::size_t pages_alive() const { return pages_.size(); }
  std::size_t mappings() const { return mapped_.size(); }

  std::vector<std::pair<StreamHandle, StreamHandle>> waits;  // (waiting stream, mark's stream)
  int synchronized = 0;
  int passed_calls = 0;
  std::chrono::milliseconds access_delay{0};  // each allow_access call takes this long
  std::chrono::milliseconds unmap_delay{0};   // and each unmap call
  // The call that many calls from now fails (1: the next one); 0 never.
  int fail_map_in = 0;
  int fail_unmap_in = 0;
  int fail_mark_in = 0;
  int fail_unreserve_in = 0;
  std::uint64_t largest_reserve = ~std::uint64_t{0};  // longer ranges are refused
  // Where given, the copy holds alive now (FakeCopyHolder), and the calls that map, unmap, set
  // access or make a page with one alive and without.
  const int* holds_alive = nullptr;
  int calls_held = 0;
  int calls_unheld = 0;

 private:
  void note_hold() {
    if (holds_alive == nullptr) return;
    ++(*holds_alive > 0 ? calls_held : calls_unheld);
  }

  static void fail_if(int& countdown) {
    if (countdown > 0 && --countdown == 0) throw Error(ErrorKind::kCuda, "injected driver failure");
  }

  std::uint64_t device_pages_;
  std::uint64_t page_;
  PageHandle last_page_ = 0;
  std::set<PageHandle> pages_;
  DeviceAddress next_address_ = DeviceAddress{1} << 40;
  std::map<DeviceAddress, std::uint64_t> reserved_;
  std::map<DeviceAddress, PageHandle> mapped_;
  std::uintptr_t last_mark_ = 0;
  std::map<std::uintptr_t, StreamHandle> stream_of_;
  std::set<std::uintptr_t> pending_;
  std::set<StreamHandle> held_;
  int live_marks_ = 0;
};

StreamHandle stream(std::uintptr_t n) {
  return reinterpret_cast<StreamHandle>(n);
}
const StreamHandle kCompute = nullptr;  // PyTorch's default stream is the null stream
const StreamHandle kCopy = stream(7);

TEST(PagedDeviceMemory, AFreedBlockIsHandedAgainToTheSameSizeOnItsStreamWithoutMapping) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  driver.hold(kCompute);  // the device is behind: stream order alone makes the reuse safe
  void* first = memory.allocate(3 * kPage - 100, kCompute);
  memory.free(first);
  void* again = memory.allocate(3 * kPage, kCompute);
  EXPECT_EQ(again, first);
  const PagedMemoryStats stats = memory.stats();
  EXPECT_EQ(stats.reused, 1U);
  EXPECT_EQ(stats.pages_mapped, 3U);
  EXPECT_EQ(stats.in_use_bytes, 3 * kPage);
  EXPECT_TRUE(driver.waits.empty());
  memory.free(again);
  driver.finish(kCompute);
}

TEST(PagedDeviceMemory, ARequestLongerThanAnyFreedBlockTakesThePagesOfSeveral) {
  FakePageDriver driver(10);
  PagedDeviceMemory memory(driver, kRanges);
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(memory.allocate(2 * kPage, kCompute));
  std::set<PageHandle> first_pages;
  for (void* block : blocks)
    for (std::uint64_t i = 0; i < 2; ++i)
      first_pages.insert(driver.page_at(static_cast<char*>(block) + i * kPage));
  driver.hold(kCompute);
  for (void* block : blocks) memory.free(block);
  // The caching allocator would need 8 contiguous free pages here; every page is in a freed block.
  void* big = memory.allocate(8 * kPage, kCompute);
  PagedMemoryStats stats = memory.stats();
  EXPECT_EQ(stats.held_bytes, 10 * kPage) << "no page beyond the device's";
  EXPECT_EQ(stats.taken_blocks, 4U);
  EXPECT_TRUE(driver.waits.empty()) << "blocks of the same stream need no wait";
  for (std::uint64_t i = 0; i < 8; ++i)
    EXPECT_TRUE(first_pages.contains(driver.page_at(static_cast<char*>(big) + i * kPage)));
  auto still_mapped = [&] {
    return std::count_if(blocks.begin(), blocks.end(), [&](void* block) {
      return driver.mapped_at(reinterpret_cast<DeviceAddress>(block));
    });
  };
  // The old addresses stay mapped until the device has run past the frees.
  EXPECT_EQ(still_mapped(), 5);
  driver.finish(kCompute);
  void* small = memory.allocate(100, kCompute);  // any call unmaps what has passed
  EXPECT_EQ(still_mapped(), 1) << "the last freed block, taken for the small slab just now";
  stats = memory.stats();
  EXPECT_EQ(stats.out_of_memory, 0U);
  memory.free(big);
  memory.free(small);
}

// Freed blocks taken while the device is behind stay mapped at their old addresses until their
// work is done; a request meanwhile looks at the oldest only, not at each (W3 retires ~1 300 a
// step, and every request looks).
TEST(PagedDeviceMemory, ARequestLooksAtTheOldestRetiredPagesOnlyWhileTheirWorkRuns) {
  FakePageDriver driver(12);
  PagedDeviceMemory memory(driver, kRanges);
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(memory.allocate(2 * kPage, kCompute));
  driver.hold(kCompute);
  for (void* block : blocks) memory.free(block);
  void* big = memory.allocate(11 * kPage, kCompute);  // 5 blocks taken whole, one cut
  ASSERT_EQ(memory.stats().taken_blocks, 6U);
  const int before = driver.passed_calls;
  std::vector<void*> small;
  for (int i = 0; i < 10; ++i) small.push_back(memory.allocate(100, kCompute));
  EXPECT_LE(driver.passed_calls - before, 10 + 2) << "one look a request (and the slab's own)";
  driver.finish(kCompute);
  memory.free(small.back());
  small.pop_back();
  small.push_back(memory.allocate(100, kCompute));  // every retired block's work is done now
  const auto still_mapped = std::count_if(blocks.begin(), blocks.end(), [&](void* block) {
    return driver.mapped_at(reinterpret_cast<DeviceAddress>(block));
  });
  EXPECT_EQ(still_mapped, 1) << "only the block cut, whose head became the small requests' slab";
  for (void* block : small) memory.free(block);
  memory.free(big);
}

TEST(PagedDeviceMemory, PagesOfAnotherStreamsBlockWaitOnTheDeviceForItsWork) {
  FakePageDriver driver(4);
  PagedDeviceMemory memory(driver, kRanges);
  void* on_copy = memory.allocate(4 * kPage, kCopy);
  driver.hold(kCopy);
  memory.free(on_copy);
  void* on_compute = memory.allocate(4 * kPage, kCompute);
  ASSERT_EQ(driver.waits.size(), 1U);
  EXPECT_EQ(driver.waits[0], std::make_pair(kCompute, kCopy));
  EXPECT_EQ(memory.stats().device_waits, 1U);
  driver.finish(kCopy);
  memory.free(on_compute);
  // Once the other stream's work is done, taking its pages needs no wait.
  void* back_on_copy = memory.allocate(4 * kPage, kCopy);
  EXPECT_EQ(driver.waits.size(), 1U);
  memory.free(back_on_copy);
}

TEST(PagedDeviceMemory, TheRestOfASplitBlockKeepsItsStreamsWait) {
  FakePageDriver driver(6);
  PagedDeviceMemory memory(driver, kRanges);
  void* on_copy = memory.allocate(6 * kPage, kCopy);
  driver.hold(kCopy);
  memory.free(on_copy);
  void* first = memory.allocate(2 * kPage, kCopy);  // same stream: no wait, 4 pages kept freed
  EXPECT_EQ(first, on_copy);
  EXPECT_TRUE(driver.waits.empty());
  void* second = memory.allocate(4 * kPage, kCompute);  // those 4 pages are still the copy's
  ASSERT_EQ(driver.waits.size(), 1U);
  EXPECT_EQ(driver.waits[0], std::make_pair(kCompute, kCopy));
  driver.finish(kCopy);
  memory.free(first);
  memory.free(second);
}

TEST(PagedDeviceMemory, AFreedBlockServesAShorterRequestInPlaceAndKeepsTheRest) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  void* whole = memory.allocate(6 * kPage, kCompute);
  memory.free(whole);
  void* front = memory.allocate(2 * kPage, kCompute);
  void* rest = memory.allocate(4 * kPage, kCompute);
  EXPECT_EQ(front, whole);
  EXPECT_EQ(rest, static_cast<char*>(whole) + 2 * kPage);
  const PagedMemoryStats stats = memory.stats();
  EXPECT_EQ(stats.pages_mapped, 6U) << "nothing mapped again";
  EXPECT_EQ(stats.split_blocks, 1U);
  EXPECT_EQ(stats.reused, 2U);
  memory.free(front);
  memory.free(rest);
}

TEST(PagedDeviceMemory, AFreedBlockGrowsIntoTheFreeEndOfItsRangeMappingOnlyTheShortfall) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  void* first = memory.allocate(3 * kPage, kCompute);  // its range has room for 6 pages
  memory.free(first);
  void* longer = memory.allocate(5 * kPage, kCompute);
  EXPECT_EQ(longer, first);
  PagedMemoryStats stats = memory.stats();
  EXPECT_EQ(stats.grown_blocks, 1U);
  EXPECT_EQ(stats.pages_mapped, 5U) << "3 pages kept in place, 2 mapped after them";
  memory.free(longer);
  void* too_long = memory.allocate(8 * kPage, kCompute);  // no room for 3 more after 5 of 6
  EXPECT_NE(too_long, first);
  stats = memory.stats();
  EXPECT_EQ(stats.grown_blocks, 1U);
  EXPECT_EQ(stats.pages_mapped, 13U);
  memory.free(too_long);
}

TEST(PagedDeviceMemory, ByDefaultABlocksRangeIsEightTimesItsLengthAndNeverZero) {
  FakePageDriver driver(32);
  PagedDeviceMemory memory(driver);
  void* first = memory.allocate(2 * kPage, kCompute);
  memory.free(first);
  void* grown = memory.allocate(16 * kPage, kCompute);
  EXPECT_EQ(grown, first) << "grown in place to the range's end";
  EXPECT_EQ(memory.stats().pages_mapped, 16U);
  memory.free(grown);
  void* beyond = memory.allocate(17 * kPage, kCompute);
  EXPECT_NE(beyond, first);
  memory.free(beyond);
  EXPECT_THROW(PagedDeviceMemory(driver, 0), Error);
  EXPECT_THROW(PagedDeviceMemory(driver, PagedDeviceMemory::kLongestRangeLengths + 1), Error);
}

// The room to grow is a convenience: where the driver refuses a range eight blocks long, the block
// gets one as long as itself; where it refuses that too, the request fails and its pages stay free.
TEST(PagedDeviceMemory, ARefusedLongRangeFallsBackToOneAsLongAsTheBlock) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver);
  driver.largest_reserve = 4 * kPage;
  void* three = memory.allocate(3 * kPage, kCompute);
  memory.free(three);
  void* four = memory.allocate(4 * kPage, kCompute);
  EXPECT_NE(four, three) << "no room to grow in a range as long as the block";
  EXPECT_EQ(memory.stats().grown_blocks, 0U);
  memory.free(four);
  EXPECT_THROW(memory.allocate(12 * kPage, kCompute), Error);
  EXPECT_EQ(memory.stats().in_use_bytes, 0U);
  driver.largest_reserve = ~std::uint64_t{0};
  void* twelve = memory.allocate(12 * kPage, kCompute);  // the pages are still there to serve it
  EXPECT_NE(twelve, nullptr);
  memory.free(twelve);
}

TEST(PagedDeviceMemory, AFreedBlockDoesNotGrowOverAHoleIntoAMappedPage) {
  FakePageDriver driver(6);
  PagedDeviceMemory memory(driver, kRanges);
  void* first = memory.allocate(3 * kPage, kCompute);  // a range of 6 slots
  memory.free(first);
  memory.free(memory.allocate(5 * kPage, kCompute));  // grown to slots 0-4
  void* slot0 = memory.allocate(kPage, kCompute);
  void* slot1 = memory.allocate(kPage, kCompute);
  void* slots2to4 = memory.allocate(3 * kPage, kCompute);
  memory.free(slot1);
  memory.free(memory.allocate(2 * kPage, kCopy));  // the sixth page and slot 1's: slot 1 is a hole
  memory.free(slot0);
  // Slot 1 is unmapped but slot 2 is not: the block at slot 0 cannot grow to 3 pages.
  void* three = memory.allocate(3 * kPage, kCompute);
  EXPECT_NE(three, slot0);
  EXPECT_EQ(memory.stats().grown_blocks, 1U);
  EXPECT_TRUE(driver.mapped_at(reinterpret_cast<DeviceAddress>(slots2to4)));
  memory.free(three);
  memory.free(slots2to4);
}

TEST(PagedDeviceMemory, FreedNeighboursJoinToServeARequestAsLongAsBoth) {
  FakePageDriver driver(5);
  PagedDeviceMemory memory(driver, kRanges);
  void* whole = memory.allocate(5 * kPage, kCompute);
  memory.free(whole);
  void* left = memory.allocate(2 * kPage, kCompute);
  void* right = memory.allocate(3 * kPage, kCompute);
  memory.free(right);
  memory.free(left);
  EXPECT_EQ(memory.stats().joined_blocks, 1U);
  EXPECT_EQ(memory.allocate(5 * kPage, kCompute), whole);
  EXPECT_EQ(memory.stats().pages_mapped, 5U);
  memory.free(whole);
}

TEST(PagedDeviceMemory, PagesAreTakenFromTheEndOfALargerFreedBlockWhichKeepsTheRest) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  void* big = memory.allocate(8 * kPage, kCompute);
  memory.free(big);
  void* on_copy = memory.allocate(3 * kPage, kCopy);  // another stream: no block of its own
  EXPECT_EQ(memory.stats().pages_mapped, 11U);
  EXPECT_EQ(driver.page_at(on_copy), driver.page_at(static_cast<char*>(big) + 5 * kPage));
  void* front = memory.allocate(5 * kPage, kCompute);  // the 5 pages left, in place
  EXPECT_EQ(front, big);
  EXPECT_EQ(memory.stats().pages_mapped, 11U);
  memory.free(on_copy);
  void* again = memory.allocate(kPage, kCopy);  // any call unmaps the taken end once its marks have passed
  EXPECT_EQ(again, on_copy);
  EXPECT_EQ(memory.stats().pages_unmapped, 3U);
  EXPECT_FALSE(driver.mapped_at(reinterpret_cast<DeviceAddress>(big) + 5 * kPage));
  EXPECT_TRUE(driver.mapped_at(reinterpret_cast<DeviceAddress>(big)));
  memory.free(again);
  memory.free(front);
}

TEST(PagedDeviceMemory, ABlockRecordedOnAnotherStreamIsNotHandedOutBeforeThatStreamIsDone) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  void* block = memory.allocate(2 * kPage, kCompute);
  memory.record_use(block, kCopy);
  driver.hold(kCopy);
  memory.free(block);
  void* other = memory.allocate(2 * kPage, kCompute);
  EXPECT_NE(other, block) << "the copy stream may still read it";
  driver.finish(kCopy);
  void* again = memory.allocate(2 * kPage, kCompute);
  EXPECT_EQ(again, block);
  memory.free(other);
  memory.free(again);
}

TEST(PagedDeviceMemory, TakingTheRecordedBlocksPagesWaitsForTheStreamThatUsedIt) {
  FakePageDriver driver(2);
  PagedDeviceMemory memory(driver, kRanges);
  void* block = memory.allocate(2 * kPage, kCompute);
  memory.record_use(block, kCopy);
  driver.hold(kCopy);
  memory.free(block);
  void* next = memory.allocate(2 * kPage, kCompute);  // no free pages: its pages, after a wait
  EXPECT_NE(next, block);
  ASSERT_EQ(driver.waits.size(), 1U);
  EXPECT_EQ(driver.waits[0], std::make_pair(kCompute, kCopy));
  driver.finish(kCopy);
  memory.free(next);
}

TEST(PagedDeviceMemory, BlocksInUseUpToTheCapMakeTheNextRequestOutOfMemory) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  memory.set_cap(5 * kPage + 1000);
  EXPECT_EQ(memory.cap(), 5 * kPage);
  void* a = memory.allocate(3 * kPage, kCompute);
  void* b = memory.allocate(2 * kPage, kCompute);
  try {
    memory.allocate(kPage, kCompute);
    FAIL() << "allocated beyond the cap";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("cap 10.0 MiB"), std::string::npos) << e.what();
  }
  EXPECT_EQ(memory.stats().out_of_memory, 1U);
  EXPECT_EQ(memory.stats().held_bytes, 5 * kPage);
  memory.free(a);
  void* c = memory.allocate(3 * kPage, kCompute);
  EXPECT_EQ(memory.stats().peak_held_bytes, 5 * kPage);
  memory.free(b);
  memory.free(c);
}

TEST(PagedDeviceMemory, ADeviceThatRefusesPagesBelowTheCapLeavesTheFreedBlocksToServe) {
  FakePageDriver driver(4);
  PagedDeviceMemory memory(driver, kRanges);
  memory.set_cap(100 * kPage);
  void* a = memory.allocate(4 * kPage, kCompute);
  memory.free(a);
  void* b = memory.allocate(3 * kPage, kCopy);  // another stream's: pages taken, not the block
  EXPECT_EQ(memory.stats().taken_blocks, 1U);
  try {
    memory.allocate(2 * kPage, kCompute);
    FAIL() << "allocated more pages than the device has";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the device refused more pages"), std::string::npos) << e.what();
  }
  memory.free(b);
}

TEST(PagedDeviceMemory, SmallRequestsShareASlabAndAFreedChunkServesItsClassAgain) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  void* a = memory.allocate(100, kCompute);
  void* b = memory.allocate(512, kCompute);
  void* c = memory.allocate(513, kCompute);  // the next class, another slab
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) / kPage, reinterpret_cast<std::uintptr_t>(b) / kPage);
  EXPECT_NE(reinterpret_cast<std::uintptr_t>(a) / kPage, reinterpret_cast<std::uintptr_t>(c) / kPage);
  EXPECT_EQ(memory.stats().in_use_bytes, 512U + 512U + 1024U);
  memory.free(a);
  EXPECT_EQ(memory.allocate(300, kCompute), a);
  EXPECT_NE(memory.allocate(300, kCopy), a) << "a chunk serves only its own stream";
  EXPECT_EQ(memory.stats().small_allocations, 5U);
  memory.record_use(b, kCopy);
  driver.hold(kCopy);
  memory.free(b);
  EXPECT_NE(memory.allocate(512, kCompute), b) << "the copy stream may still read it";
  driver.finish(kCopy);
  EXPECT_EQ(memory.allocate(512, kCompute), b);
}

TEST(PagedDeviceMemory, EmptyCacheGivesEveryPageNotInUseBackToTheDevice) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  void* kept = memory.allocate(2 * kPage, kCompute);
  void* freed = memory.allocate(5 * kPage, kCompute);
  void* small = memory.allocate(64, kCompute);
  memory.free(freed);
  driver.hold(kCompute);
  memory.empty_cache();
  EXPECT_EQ(driver.synchronized, 1);
  EXPECT_EQ(memory.stats().held_bytes, 3 * kPage) << "the block in use and the small slab";
  EXPECT_EQ(driver.pages_alive(), 3U);
  EXPECT_EQ(driver.mappings(), 3U);
  memory.free(kept);
  memory.free(small);
  driver.finish(kCompute);
}

TEST(PagedDeviceMemory, AnAddressItDidNotHandOutIsRefused) {
  FakePageDriver driver(4);
  PagedDeviceMemory memory(driver, kRanges);
  int local = 0;
  EXPECT_THROW(memory.free(&local), Error);
  EXPECT_FALSE(memory.record_use(&local, kCopy)) << "PyTorch records streams on empty tensors too";
  EXPECT_FALSE(memory.record_use(nullptr, kCopy));
  EXPECT_EQ(memory.allocate(0, kCompute), nullptr);
}

TEST(PagedDeviceMemory, ClosingUnmapsAndReleasesEverythingNotInUse) {
  FakePageDriver driver(6);
  {
    PagedDeviceMemory memory(driver, kRanges);
    void* a = memory.allocate(3 * kPage, kCompute);
    void* b = memory.allocate(2 * kPage, kCopy);
    memory.allocate(10, kCompute);
    memory.free(a);
    memory.free(b);
    memory.allocate(4 * kPage, kCompute);  // takes pages: one retired range pending
  }
  EXPECT_EQ(driver.pages_alive(), 4U) << "only the block still in use keeps its pages";
  EXPECT_EQ(driver.mappings(), 4U);
}

TEST(PagedDeviceMemory, ARequestThatCannotBeMetLeavesTheFreedBlocksWhole) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  void* kept = memory.allocate(4 * kPage, kCompute);
  void* freed = memory.allocate(3 * kPage, kCompute);
  memory.free(freed);
  EXPECT_THROW(memory.allocate(6 * kPage, kCopy), Error);
  const PagedMemoryStats before = memory.stats();
  EXPECT_EQ(before.taken_blocks, 0U);
  EXPECT_EQ(memory.allocate(3 * kPage, kCompute), freed) << "served in place, not mapped again";
  EXPECT_EQ(memory.stats().pages_mapped, before.pages_mapped);
  memory.free(kept);
}

TEST(PagedDeviceMemory, ACapOfZeroAllowsNothing) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  memory.set_cap(0);
  EXPECT_THROW(memory.allocate(kPage + 1, kCompute), Error);
  EXPECT_THROW(memory.allocate(10, kCompute), Error);
}

TEST(PagedDeviceMemory, ASmallSlabCountsOnlyItsChunksAsInUse) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  void* chunk = memory.allocate(512, kCompute);
  EXPECT_EQ(memory.stats().peak_in_use_bytes, 512U);
  EXPECT_EQ(memory.stats().held_bytes, kPage);
  memory.free(chunk);
}

TEST(PagedDeviceMemory, AMappingThatFailsPartWayLeavesNothingBehind) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  driver.fail_map_in = 3;
  EXPECT_THROW(memory.allocate(4 * kPage, kCompute), Error);
  EXPECT_EQ(driver.mappings(), 0U);
  EXPECT_EQ(memory.stats().held_bytes, driver.pages_alive() * kPage);
  void* block = memory.allocate(14 * kPage, kCompute);  // the four pages are free again
  EXPECT_EQ(memory.stats().held_bytes, 14 * kPage);
  EXPECT_EQ(driver.mappings(), 14U);
  memory.free(block);
}

TEST(PagedDeviceMemory, AnEventThatFailsWhenFreeingLeavesTheBlockToFreeAgain) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  void* block = memory.allocate(4 * kPage, kCompute);
  driver.fail_mark_in = 1;
  EXPECT_THROW(memory.free(block), Error);
  EXPECT_EQ(memory.stats().in_use_bytes, 4 * kPage);
  memory.free(block);
  EXPECT_EQ(memory.stats().in_use_bytes, 0U);
}

TEST(PagedDeviceMemory, AnUnmapThatFailsWhileEmptyingNeverHandsOutAnUnmappedAddress) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  void* a = memory.allocate(2 * kPage, kCompute);
  void* b = memory.allocate(2 * kPage, kCopy);
  memory.free(a);
  memory.free(b);
  driver.fail_unmap_in = 3;  // the second block's first page
  EXPECT_THROW(memory.empty_cache(), Error);
  for (int i = 0; i < 3; ++i) {
    void* fresh = memory.allocate(2 * kPage, kCompute);  // does not keep failing
    EXPECT_TRUE(driver.mapped_at(reinterpret_cast<DeviceAddress>(fresh)));
    memory.free(fresh);
  }
  memory.empty_cache();
  EXPECT_EQ(driver.mappings(), 0U);
  EXPECT_EQ(driver.pages_alive(), 0U);
  EXPECT_EQ(memory.stats().held_bytes, 0U);
}

TEST(PagedDeviceMemory, LargerPagesRoundBlocksUpAndMakeLargerSlabs) {
  constexpr std::uint64_t kLarge = std::uint64_t{32} << 20;
  FakePageDriver driver(8, kLarge);
  PagedDeviceMemory memory(driver, kRanges);
  void* block = memory.allocate(40 << 20, kCompute);
  EXPECT_EQ(memory.stats().in_use_bytes, 2 * kLarge);
  EXPECT_EQ(memory.stats().pages_mapped, 2U);
  void* small = memory.allocate(100, kCompute);
  EXPECT_EQ(memory.stats().held_bytes, 3 * kLarge);
  EXPECT_EQ(memory.stats().in_use_bytes, 2 * kLarge + 512);
  memory.free(small);
  memory.free(block);
}

TEST(PagedDeviceMemory, AnUnreserveThatFailsIsTriedAgainWithoutUnmappingTwice) {
  FakePageDriver driver(8);
  PagedDeviceMemory memory(driver, kRanges);
  memory.free(memory.allocate(2 * kPage, kCompute));
  driver.fail_unreserve_in = 1;
  EXPECT_THROW(memory.empty_cache(), Error);
  void* next = memory.allocate(2 * kPage, kCompute);  // unmaps nothing twice, gives the range up
  EXPECT_TRUE(driver.mapped_at(reinterpret_cast<DeviceAddress>(next)));
  memory.free(next);
  memory.empty_cache();
  EXPECT_EQ(driver.mappings(), 0U);
  EXPECT_EQ(driver.pages_alive(), 0U);
}

TEST(PagedDeviceMemory, ARequestThatCannotGrowOrBeMappedCountsOneRefusal) {
  FakePageDriver driver(4);
  PagedDeviceMemory memory(driver, kRanges);
  void* kept = memory.allocate(2 * kPage, kCompute);
  memory.free(memory.allocate(2 * kPage, kCompute));
  EXPECT_THROW(memory.allocate(3 * kPage, kCompute), Error);
  EXPECT_EQ(memory.stats().out_of_memory, 1U);
  memory.free(kept);
}

TEST(PagedDeviceMemory, PagesSmallerThanTheSmallestSlabAreRefused) {
  class TinyPages final : public PageDriver {
   public:
    std::uint64_t page_bytes() const override { return 4096; }
    std::uint64_t device_bytes() const override { return 1 << 30; }
    std::optional<PageHandle> create_page() override { return std::nullopt; }
    void release_page(PageHandle) override {}
    DeviceAddress reserve(std::uint64_t) override { return 0; }
    void unreserve(DeviceAddress, std::uint64_t) override {}
    void map(DeviceAddress, PageHandle) override {}
    void unmap(DeviceAddress) override {}
    void allow_access(DeviceAddress, std::uint64_t) override {}
    StreamMark mark(StreamHandle) override { return nullptr; }
    bool passed(StreamMark) override { return true; }
    void wait(StreamHandle, StreamMark) override {}
    void drop(StreamMark) noexcept override {}
    void synchronize() override {}
  } tiny;
  EXPECT_THROW(PagedDeviceMemory memory(tiny), Error);
}

TEST(PagedDeviceMemory, TheTimeSettingAccessIsCountedApartAndWithinTheMappingTime) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  driver.access_delay = std::chrono::milliseconds(20);
  void* block = memory.allocate(3 * kPage, kCompute);  // one range mapped, access set once
  const PagedMemoryStats stats = memory.stats();
  EXPECT_GE(stats.access_s, 0.020);
  EXPECT_LT(stats.access_s, 1.0);
  EXPECT_GE(stats.map_s, stats.access_s);  // map_s holds the access calls too
  memory.free(block);
  EXPECT_EQ(memory.stats().access_s, stats.access_s);  // freeing sets no access
}

// A mapping or an unmapping over kSlowDriverStretch (10 ms) is counted with its time; shorter
// ones are not.
TEST(PagedDeviceMemory, DriverStretchesOverTenMillisecondsAreCountedWithTheirTime) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  void* quick = memory.allocate(2 * kPage, kCompute);
  EXPECT_EQ(memory.stats().slow_maps, 0U);
  driver.access_delay = std::chrono::milliseconds(15);
  void* slow = memory.allocate(3 * kPage, kCompute);
  PagedMemoryStats stats = memory.stats();
  EXPECT_EQ(stats.slow_maps, 1U);
  EXPECT_GE(stats.slow_map_s, 0.015);
  EXPECT_LE(stats.slow_map_s, stats.map_s);
  EXPECT_EQ(stats.slow_unmaps, 0U);
  memory.free(quick);
  memory.free(slow);
  driver.unmap_delay = std::chrono::milliseconds(6);
  memory.empty_cache();  // unmaps a 2-page block (12 ms) and a 3-page one (18 ms)
  stats = memory.stats();
  EXPECT_EQ(stats.slow_unmaps, 2U);
  EXPECT_GE(stats.slow_unmap_s, 0.030);
  EXPECT_LE(stats.slow_unmap_s, stats.unmap_s);
}

// Counts the holds it makes and those alive (DeviceCopier::hold_copies' stand-in).
class FakeCopyHolder {
 public:
  class Hold final : public CopyHold {
   public:
    Hold(int& alive, bool quiet) : alive_(alive), quiet_(quiet) { ++alive_; }
    ~Hold() override { --alive_; }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    bool quiet() const override { return quiet_; }

   private:
    int& alive_;
    bool quiet_;
  };

  PagedDeviceMemory::CopyHolder holder() {
    return [this] {
      ++made;
      return std::make_unique<Hold>(alive, quiet);
    };
  }
  int made = 0;
  int alive = 0;
  bool quiet = true;
};

// The driver's calls run with the copies held (they wait for the copy engines otherwise, page by
// page: session 43), one hold a request, from its first driver call until it is served.
TEST(PagedDeviceMemory, ARequestThatCallsTheDriverHoldsTheCopiesOnceUntilItIsServed) {
  FakePageDriver driver(10);
  PagedDeviceMemory memory(driver, kRanges);
  FakeCopyHolder copies;
  driver.holds_alive = &copies.alive;
  memory.hold_copies_with(&copies, copies.holder());
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(memory.allocate(2 * kPage, kCompute));
  EXPECT_EQ(copies.made, 5) << "each made and mapped two pages";
  EXPECT_EQ(copies.alive, 0) << "a hold ends with its request";
  driver.hold(kCompute);
  for (void* block : blocks) memory.free(block);
  EXPECT_EQ(copies.made, 5) << "freeing calls no driver";
  void* again = memory.allocate(2 * kPage, kCompute);
  EXPECT_EQ(copies.made, 5) << "served in place: no driver call, no hold";
  void* big = memory.allocate(8 * kPage, kCompute);  // takes 4 freed blocks' pages, maps them
  EXPECT_EQ(copies.made, 6);
  driver.finish(kCompute);
  memory.free(again);
  const auto still_mapped = [&] {
    return std::count_if(blocks.begin(), blocks.end(), [&](void* block) {
      return driver.mapped_at(reinterpret_cast<DeviceAddress>(block));
    });
  };
  void* small = memory.allocate(100, kCompute);  // a slab cut from a freed block: no driver call
  EXPECT_EQ(copies.made, 6);
  EXPECT_EQ(still_mapped(), 5) << "the taken pages wait for a request that maps";
  memory.free(big);
  // 9 pages: no freed block holds them. Under one hold the taken pages' old addresses are
  // unmapped, and the 8-page block grows by the last freed page.
  void* nine = memory.allocate(9 * kPage, kCompute);
  EXPECT_EQ(copies.made, 7);
  EXPECT_EQ(still_mapped(), 1) << "the freed block the slab came from";
  EXPECT_EQ(copies.alive, 0);
  EXPECT_GT(driver.calls_held, 0);
  EXPECT_EQ(driver.calls_unheld, 0) << "every map, unmap, access and page made under a hold";
  PagedMemoryStats stats = memory.stats();
  EXPECT_EQ(stats.copy_holds, 7U);
  EXPECT_EQ(stats.grown_blocks, 1U);
  EXPECT_EQ(stats.copy_holds_not_quiet, 0U);
  EXPECT_GE(stats.copy_hold_s, 0.0);
  copies.quiet = false;
  memory.free(nine);
  memory.empty_cache();  // unmaps the freed blocks under one hold whose wait ran out
  stats = memory.stats();
  EXPECT_EQ(stats.copy_holds, 8U);
  EXPECT_EQ(stats.copy_holds_not_quiet, 1U);
  EXPECT_EQ(driver.calls_unheld, 0);
  memory.free(small);
}

TEST(PagedDeviceMemory, OnlyTheOwnerOfTheHolderStopsTheHolds) {
  FakePageDriver driver(10);
  PagedDeviceMemory memory(driver, kRanges);
  FakeCopyHolder copies;
  int someone_else = 0;
  memory.hold_copies_with(&copies, copies.holder());
  memory.stop_holding_copies(&someone_else);
  void* held = memory.allocate(2 * kPage, kCompute);
  EXPECT_EQ(copies.made, 1);
  memory.stop_holding_copies(&copies);
  void* unheld = memory.allocate(2 * kPage, kCompute);
  EXPECT_EQ(copies.made, 1);
  EXPECT_EQ(memory.stats().copy_holds, 1U);
  memory.free(held);
  memory.free(unheld);
}

// A hold ends with a request that fails too; a holder that can hold nothing (nullptr) is no hold,
// and one that throws leaves the request to be served without a hold.
TEST(PagedDeviceMemory, AFailedRequestEndsItsHoldAndAnEmptyHoldIsNotCounted) {
  FakePageDriver driver(10);
  PagedDeviceMemory memory(driver, kRanges);
  FakeCopyHolder copies;
  memory.hold_copies_with(&copies, copies.holder());
  driver.fail_map_in = 2;
  EXPECT_THROW(memory.allocate(3 * kPage, kCompute), Error);
  EXPECT_EQ(copies.made, 1);
  EXPECT_EQ(copies.alive, 0);
  memory.hold_copies_with(&copies, [] { return std::unique_ptr<CopyHold>(); });
  void* block = memory.allocate(3 * kPage, kCompute);
  EXPECT_EQ(memory.stats().copy_holds, 1U);
  // A holder that throws: the request is served without a hold.
  memory.hold_copies_with(&copies,
                          []() -> std::unique_ptr<CopyHold> { throw Error(ErrorKind::kCuda, "no hold"); });
  void* unheld = memory.allocate(2 * kPage, kCompute);
  EXPECT_NE(unheld, nullptr);
  EXPECT_EQ(memory.stats().copy_holds, 1U);
  memory.free(block);
  memory.free(unheld);
}

// A request no freed block holds takes the small freed blocks' pages first, whole, and cuts only
// the last one it needs: the large freed blocks stay whole for the large requests, which on W3
// come back every micro-batch (the 1-2 GiB loss tensors; session 43's recording replayed maps
// 31-54% fewer pages than taking the covering block, else the largest, first).
TEST(PagedDeviceMemory, TheSmallFreedBlocksGiveTheirPagesFirstSoThatALargeOneStaysWhole) {
  FakePageDriver driver(12);
  PagedDeviceMemory memory(driver, kRanges);
  // Blocks of 2, 2 and 4 pages that fill their address ranges (each grown in place to twice its
  // first length), so that none can grow, and a live block of 4: the device's 12 pages.
  const auto filling = [&](std::uint64_t pages) {
    memory.free(memory.allocate(pages / 2 * kPage, kCompute));
    return memory.allocate(pages * kPage, kCompute);
  };
  void* a = filling(2);
  void* b = filling(2);
  void* c = filling(4);
  void* d = memory.allocate(4 * kPage, kCompute);
  ASSERT_EQ(memory.stats().grown_blocks, 3U);
  memory.free(a);
  memory.free(b);
  memory.free(c);
  void* five = memory.allocate(5 * kPage, kCompute);  // 2 + 2 whole, 1 page of the 4-page block
  const std::uint64_t mapped = memory.stats().pages_mapped;
  void* three = memory.allocate(3 * kPage, kCompute);
  EXPECT_EQ(three, static_cast<char*>(c)) << "the 4-page block's rest serves it in place";
  EXPECT_EQ(memory.stats().pages_mapped, mapped);
  memory.free(five);
  memory.free(three);
  memory.free(d);
}

// A recording starts with the blocks live then, as allocations, so that their frees name blocks a
// replay has; then every request as served, with the steps marked, until it is taken.
TEST(PagedDeviceMemory, ARecordingKeepsTheLiveBlocksThenEveryRequestUntilTaken) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  EXPECT_EQ(memory.take_recording(), nullptr);
  memory.mark_step();  // nothing under way: nothing happens
  void* before = memory.allocate(3 * kPage - 100, kCompute);
  void* small = memory.allocate(1000, kCompute);
  memory.start_recording();
  void* copy = memory.allocate(kPage, kCopy);
  EXPECT_TRUE(memory.record_use(copy, kCompute));
  memory.free(before);
  memory.mark_step();
  memory.free(copy);
  const std::unique_ptr<PagedRecording> recording = memory.take_recording();
  memory.free(small);  // after the recording ended
  ASSERT_NE(recording, nullptr);
  EXPECT_EQ(memory.take_recording(), nullptr);
  EXPECT_EQ(recording->page_bytes(), kPage);
  using Kind = PagedRequest::Kind;
  const auto& r = recording->requests();
  ASSERT_EQ(r.size(), 7U);
  // The live blocks, as long as their pages or size class, on the compute stream (stream 0).
  const bool large_first = r[0].bytes == 3 * kPage;
  const PagedRequest& large = large_first ? r[0] : r[1];
  const PagedRequest& chunk = large_first ? r[1] : r[0];
  EXPECT_EQ(large.kind, Kind::kAllocate);
  EXPECT_EQ(large.bytes, 3 * kPage);
  EXPECT_EQ(chunk.bytes, 1024U);
  EXPECT_EQ(large.stream, 0U);
  EXPECT_EQ(r[2].kind, Kind::kAllocate);  // on the copy stream, as asked
  EXPECT_EQ(r[2].bytes, kPage);
  EXPECT_EQ(r[2].stream, 1U);
  EXPECT_EQ(r[3].kind, Kind::kUse);
  EXPECT_EQ(r[3].block, r[2].block);
  EXPECT_EQ(r[3].stream, 0U);
  EXPECT_EQ(r[4].kind, Kind::kFree);
  EXPECT_EQ(r[4].block, large.block);
  EXPECT_EQ(r[5].kind, Kind::kStep);
  EXPECT_EQ(r[6].kind, Kind::kFree);
  EXPECT_EQ(r[6].block, r[2].block);
  // The mark carries what the allocator counted since the recording began: one page mapped.
  ASSERT_EQ(recording->counted().size(), 1U);
  ASSERT_TRUE(recording->counted()[0].has_value());
  EXPECT_EQ(recording->counted()[0]->pages_mapped, 1U);
}

// Freed blocks at the start go in as allocations freed at once, so that a replay's cache starts
// with them; a free that fails (its event could not be made) is no free in the recording either.
TEST(PagedDeviceMemory, ARecordingStartsWithTheFreedBlocksAndLeavesOutAFailedFree) {
  FakePageDriver driver(16);
  PagedDeviceMemory memory(driver, kRanges);
  void* cached = memory.allocate(2 * kPage, kCopy);
  memory.free(cached);
  memory.start_recording();
  void* block = memory.allocate(kPage, kCompute);
  driver.fail_mark_in = 1;
  EXPECT_THROW(memory.free(block), Error);
  memory.mark_step();
  const std::unique_ptr<PagedRecording> recording = memory.take_recording();
  using Kind = PagedRequest::Kind;
  const auto& r = recording->requests();
  ASSERT_EQ(r.size(), 4U);
  EXPECT_EQ(r[0].kind, Kind::kAllocate);
  EXPECT_EQ(r[0].bytes, 2 * kPage);
  EXPECT_EQ(r[1].kind, Kind::kFree);
  EXPECT_EQ(r[1].block, r[0].block);
  EXPECT_EQ(r[2].kind, Kind::kAllocate);  // served from the cached block's pages: no free follows
  EXPECT_EQ(r[3].kind, Kind::kStep);
  memory.free(block);  // the block is still live in the allocator
}

}  // namespace
}  // namespace teraio::io
