// io/paged_device_memory: device memory made of fixed-size physical pages, each block mapped at
// an address range of its own (CUDA's virtual memory management), to stand in PyTorch's
// allocator slot. Why: the caching allocator serves a request from one free run of addresses
// as long as the request. At the device's limit a 0.5–2 GiB request seldom finds one, and the
// allocator then unmaps its whole cache, waiting for the device (W3: 70–100 times a step). Here
// any free pages serve any request. Like the caching allocator, a request is served in place by
// the smallest freed block of its stream that holds it (the rest stays freed), and freed
// neighbours are joined. A request that no freed block holds takes pages from the ends of freed
// blocks, the smallest first, and maps them after the largest freed block of its stream that has
// room after it in its address range (or at a new address): stream order makes that safe without
// a wait on the block's own stream, a device-side wait on an event covers other streams. Nothing
// waits on the host, and only the pages taken are unmapped, once the device has run past their
// last use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/io/device_copy.hpp"  // CopyHold

namespace teraio::io {

using DeviceAddress = std::uintptr_t;
using PageHandle = std::uint64_t;
using StreamHandle = void*;  // a cudaStream_t on the device
using StreamMark = void*;    // a cudaEvent_t on the device
class PagedRecording;        // io/paged_recording

// The calls the paged memory makes: CUDA's driver on the device, a fake in tests.
class PageDriver {
 public:
  virtual ~PageDriver() = default;
  virtual std::uint64_t page_bytes() const = 0;
  virtual std::uint64_t device_bytes() const = 0;
  // nullopt when the device has no memory left for another page.
  virtual std::optional<PageHandle> create_page() = 0;
  virtual void release_page(PageHandle page) = 0;
  virtual DeviceAddress reserve(std::uint64_t bytes) = 0;
  virtual void unreserve(DeviceAddress address, std::uint64_t bytes) = 0;
  virtual void map(DeviceAddress address, PageHandle page) = 0;
  virtual void unmap(DeviceAddress address) = 0;  // the one page mapped there
  virtual void allow_access(DeviceAddress address, std::uint64_t bytes) = 0;
  // An event recorded on the stream now; passed() once the device has run past it.
  virtual StreamMark mark(StreamHandle stream) = 0;
  virtual bool passed(StreamMark mark) = 0;
  // The stream's later work waits for the mark, on the device.
  virtual void wait(StreamHandle stream, StreamMark mark) = 0;
  virtual void drop(StreamMark mark) noexcept = 0;
  virtual void synchronize() = 0;  // the whole device
};

struct PagedMemoryStats {
  std::uint64_t page_bytes = 0;
  std::uint64_t cap_bytes = 0;
  std::uint64_t in_use_bytes = 0;  // blocks handed out, rounded to pages or small classes
  std::uint64_t peak_in_use_bytes = 0;
  std::uint64_t held_bytes = 0;  // pages created and not released: the "reserved" memory
  std::uint64_t peak_held_bytes = 0;
  std::uint64_t allocations = 0;
  std::uint64_t small_allocations = 0;  // served from small-class slabs
  std::uint64_t reused = 0;             // served in place by a freed block of its stream
  std::uint64_t split_blocks = 0;       // freed blocks cut in two: one part used, the rest kept
  std::uint64_t joined_blocks = 0;      // freed blocks joined with a freed neighbour
  std::uint64_t grown_blocks = 0;       // freed blocks grown in place into their range's free end
  std::uint64_t recorded_uses = 0;      // record_use calls that added a stream
  std::uint64_t mapped_blocks = 0;      // blocks mapped at a new address
  std::uint64_t taken_blocks = 0;       // freed blocks whose pages a new block took
  std::uint64_t pages_mapped = 0;
  std::uint64_t pages_unmapped = 0;
  std::uint64_t device_waits = 0;  // a stream made to wait for another stream's event
  double map_s = 0;                // host time in the driver's reserve, map and access calls
  double access_s = 0;             // of map_s, in its access calls (W3: which call is slow)
  double unmap_s = 0;              // host time in its unmap and unreserve calls
  // Single mappings (a block's pages with their access) and unmappings that took over
  // kSlowDriverStretch, and their time: whether W3's steps that ran 0.2-0.5 s late in a few
  // micro-batches (session 42) met one long driver stretch or many short ones.
  std::uint64_t slow_maps = 0;
  double slow_map_s = 0;
  std::uint64_t slow_unmaps = 0;
  double slow_unmap_s = 0;
  // Copy holds (PagedDeviceMemory::hold_copies_with): requests whose driver calls ran with the
  // copier's copies held, of them those whose wait for the link ran out before it was quiet,
  // and the host time spent making them (the wait for the link; not in map_s or unmap_s).
  std::uint64_t copy_holds = 0;
  std::uint64_t copy_holds_not_quiet = 0;
  double copy_hold_s = 0;
  std::uint64_t out_of_memory = 0;
  std::uint64_t emptied = 0;  // empty_cache() calls
};

inline constexpr double kSlowDriverStretch = 0.010;  // seconds

// What the counters grew by from `before` to `after` (the host times and slow stretches too);
// the byte levels and peaks are `after`'s.
PagedMemoryStats counter_growth(const PagedMemoryStats& after, const PagedMemoryStats& before);

// Thread-safe. Blocks up to kSmallLimit come from slabs of one page cut into equal chunks of a
// power-of-two class; slabs are kept for good, as the caching allocator keeps its small pool.
class PagedDeviceMemory {
 public:
  static constexpr std::uint64_t kSmallLimit = std::uint64_t{1} << 20;
  static constexpr std::uint64_t kSmallestClass = 512;
  // A block mapped at a new address gets a reserved range this many times its length (by
  // default), so that it can grow in place once freed: only the shortfall is mapped then.
  // Addresses cost nothing but the reservation (W3: at most 552 GiB of them reserved). 2 until
  // session 43; W3's recording replayed maps 19-25% fewer pages a step with 8 (bench/RESULTS.md).
  static constexpr std::uint64_t kRangeLengths = 8;
  // The most: a range's slot count (lengths x pages) stays far from overflowing.
  static constexpr std::uint64_t kLongestRangeLengths = 1024;

  // `range_lengths`: each new address range's length in its first block's (kRangeLengths; 1 to
  // kLongestRangeLengths, else Error(kInvalidArgument)); where the driver refuses a range that
  // long, the block gets one as long as itself.
  explicit PagedDeviceMemory(PageDriver& driver, std::uint64_t range_lengths = kRangeLengths);
  ~PagedDeviceMemory();
  PagedDeviceMemory(const PagedDeviceMemory&) = delete;
  PagedDeviceMemory& operator=(const PagedDeviceMemory&) = delete;

  // Memory usable by work queued on `stream` after this call. nullptr for 0 bytes. Throws
  // Error(kOutOfMemory) when the pages in use leave too few under the cap.
  void* allocate(std::uint64_t bytes, StreamHandle stream);
  // The block goes back; work already queued may still use it. Throws on a foreign pointer.
  void free(void* address);
  // Work on `stream` uses the block too: it is not handed out again before that work is done.
  // False for an address it did not hand out (PyTorch records streams on empty tensors too).
  bool record_use(void* address, StreamHandle stream);
  // The most bytes of pages held at once, rounded down to pages (the whole device at first).
  void set_cap(std::uint64_t bytes);
  std::uint64_t cap() const;
  // Waits for the device, unmaps every freed block and gives its pages back to the driver.
  // A driver call that fails part-way leaves every block either still freed and mapped or
  // unmapped with its pages free, never both.
  void empty_cache();
  PagedMemoryStats stats() const;

  // From now on a request that calls the driver to map, unmap or make pages first asks `holder`
  // for a CopyHold (DeviceCopier::hold_copies) and keeps it until the request is served: the
  // driver's calls cost their idle price once the copy engines are quiet (session 43: set access
  // 37 µs a 16 MiB page against 0.5-1.1 ms beside copies). With a holder, the pages of freed
  // blocks taken are unmapped by the next request that maps, under its hold, not by the first
  // request after their work is done. `owner` names who set it; one holder at a time, the last
  // one set (a second session's replaces the first's). A holder that throws leaves the request
  // to go on without a hold (logged once).
  using CopyHolder = std::function<std::unique_ptr<CopyHold>()>;
  void hold_copies_with(const void* owner, CopyHolder holder);
  // Requests call the driver without a hold from now on, if `owner` set the holder (a later
  // owner's holder stays).
  void stop_holding_copies(const void* owner);

  // Keeps every request served from now on (io/paged_recording), the state now first (live
  // blocks as allocations, freed ones as allocations freed at once); replaces one under way.
  void start_recording();
  // Ends a step in the recording under way, with the counts since its last mark (nothing
  // without one).
  void mark_step();
  // The recording under way, which ends there; nullptr without one.
  std::unique_ptr<PagedRecording> take_recording();

 private:
  struct Marks;
  using SharedMarks = std::shared_ptr<Marks>;
  // One reserved address range, kRangeLengths times as long as its first block so that a freed
  // block at its end can grow in place; unreserved once none of its pages is mapped.
  struct Range {
    DeviceAddress address = 0;
    std::uint64_t pages = 0;   // reserved
    std::uint64_t mapped = 0;  // of them mapped now
    std::vector<bool> slot_mapped;
    bool unreserved = false;
    std::uint64_t slot(DeviceAddress at, std::uint64_t page) const { return (at - address) / page; }
  };
  struct Block {
    std::shared_ptr<Range> range;
    DeviceAddress address = 0;  // inside range
    std::vector<PageHandle> pages;
    StreamHandle stream = nullptr;
    std::vector<StreamHandle> used_on;  // other streams (record_use), while in use
    SharedMarks marks;                  // set while freed
    DeviceAddress end(std::uint64_t page) const { return address + pages.size() * page; }
  };
  struct FreePage {
    PageHandle page = 0;
    SharedMarks marks;  // work of its last block, when it came from a freed block
  };
  struct Retired {
    std::shared_ptr<Range> range;
    DeviceAddress address = 0;
    std::uint64_t pages = 0;
    SharedMarks marks;
  };
  struct SmallChunk {
    DeviceAddress address = 0;
    SharedMarks marks;
  };
  struct SmallLive {
    std::size_t size_class = 0;
    StreamHandle stream = nullptr;
    std::vector<StreamHandle> used_on;
  };

  void* allocate_small(std::uint64_t bytes, StreamHandle stream);
  void* allocate_pages(std::uint64_t pages, StreamHandle stream);
  std::unique_ptr<Block> take_block(std::uint64_t pages, StreamHandle stream);
  std::unique_ptr<Block> map_new(std::uint64_t pages, StreamHandle stream);
  std::unique_ptr<Block> grown(std::uint64_t pages, StreamHandle stream);
  bool room_after(const Block& block, std::uint64_t pages) const;
  void map_into(const std::shared_ptr<Range>& range, DeviceAddress at, std::vector<FreePage>& got);
  Block* best_cached(std::uint64_t pages, StreamHandle stream);
  std::unique_ptr<Block> detach(Block* block);
  void cache(std::unique_ptr<Block> block);
  std::unique_ptr<Block> cut_tail(Block& block, std::uint64_t keep);
  std::vector<FreePage> gather(std::uint64_t pages, StreamHandle stream);
  void take_from_freed(std::uint64_t pages, StreamHandle stream, std::vector<FreePage>& got);
  Error no_room(std::uint64_t pages, std::string_view why);
  void retire(std::unique_ptr<Block> block, std::vector<FreePage>& got);
  bool ready_for(const Marks& marks, StreamHandle stream);
  void wait_for(const Marks& marks, StreamHandle stream);
  SharedMarks mark_streams(const std::vector<StreamHandle>& streams);
  bool all_passed(Marks& marks);
  void unmap(Range& range, DeviceAddress& address, std::uint64_t& pages);
  void unmap_retired(bool everything);
  void note_in_use(std::int64_t delta);
  // Takes a hold from the holder, if there is one and no hold is on yet (hold_).
  void hold_copies();
  void free_again(std::vector<FreePage>& pages);  // back to the free pages, with their marks

  PageDriver& driver_;
  const std::uint64_t page_;
  const std::uint64_t range_lengths_;
  mutable std::mutex mutex_;
  std::uint64_t cap_pages_;
  std::uint64_t pages_held_ = 0;
  std::vector<FreePage> free_pages_;
  std::unordered_map<DeviceAddress, std::unique_ptr<Block>> live_;
  // Freed blocks, owned by address (to find a neighbour to join) and listed by stream and size.
  std::map<DeviceAddress, std::unique_ptr<Block>> freed_;
  std::map<StreamHandle, std::multimap<std::uint64_t, Block*>> cached_;
  std::uint64_t cached_pages_ = 0;  // of the blocks in cached_
  std::deque<Retired> retired_;     // oldest first
  std::unordered_map<DeviceAddress, SmallLive> small_live_;
  std::map<std::pair<StreamHandle, std::size_t>, std::vector<SmallChunk>> small_free_;
  std::vector<std::unique_ptr<Block>> slabs_;
  PagedMemoryStats stats_;
  bool device_full_ = false;  // the driver refused a page: no more tries until the cap changes
  std::unique_ptr<PagedRecording> recording_;
  CopyHolder holder_;
  const void* holder_owner_ = nullptr;
  std::unique_ptr<CopyHold> hold_;   // on from where a request turns to the driver to its end
  bool hold_failed_ = false;         // a holder threw once: said in the log, not again
  PagedMemoryStats recorded_since_;  // the counters at the recording's last step mark
};

// The page when none is asked for, where it is a multiple of the device's granularity (else the
// granularity): the driver charges per call, so larger pages map a block in fewer calls.
inline constexpr std::uint64_t kDefaultPageBytes = std::uint64_t{8} << 20;

// CUDA's virtual memory management on `device` (driver entry points found through the runtime,
// so nothing links libcuda), with pages of `page_bytes` (0: kDefaultPageBytes; else a multiple of
// the device's granularity, 2 MiB on the H100). Throws Error(kUnsupported) where the build has no
// CUDA or the driver lacks the calls.
std::unique_ptr<PageDriver> make_cuda_page_driver(int device, std::uint64_t page_bytes = 0);

}  // namespace teraio::io
