#include "teraio/io/paged_replay.hpp"

#include <unordered_map>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::io {
namespace {

// A PageDriver that hands out handles and addresses and only counts: marks pass `lag` requests
// after they were made (advance() moves the replay on by one request).
class CountingDriver final : public PageDriver {
 public:
  CountingDriver(std::uint64_t page, std::uint64_t device, std::uint64_t lag)
      : page_(page), device_(device), lag_(lag) {}

  void advance() { ++now_; }

  std::uint64_t page_bytes() const override { return page_; }
  std::uint64_t device_bytes() const override { return device_; }
  std::optional<PageHandle> create_page() override {
    if (pages_ >= device_ / page_) return std::nullopt;
    ++pages_;
    return ++last_page_;
  }
  void release_page(PageHandle) override { --pages_; }
  DeviceAddress reserve(std::uint64_t bytes) override {
    const DeviceAddress at = next_address_;
    next_address_ += bytes;
    return at;
  }
  void unreserve(DeviceAddress, std::uint64_t) override {}
  void map(DeviceAddress, PageHandle) override {}
  void unmap(DeviceAddress) override {}
  void allow_access(DeviceAddress, std::uint64_t) override {}
  StreamMark mark(StreamHandle) override {
    made_.push_back(now_);
    return reinterpret_cast<StreamMark>(made_.size());  // never null
  }
  bool passed(StreamMark mark) override {
    return now_ >= made_.at(reinterpret_cast<std::uintptr_t>(mark) - 1) + lag_;
  }
  void wait(StreamHandle, StreamMark) override {}
  void drop(StreamMark) noexcept override {}
  void synchronize() override { now_ += lag_; }  // every mark made so far has passed

 private:
  std::uint64_t page_;
  std::uint64_t device_;
  std::uint64_t lag_;
  std::uint64_t now_ = 0;
  std::uint64_t pages_ = 0;
  PageHandle last_page_ = 0;
  DeviceAddress next_address_ = DeviceAddress{1} << 40;
  std::vector<std::uint64_t> made_;  // the request each mark was made at
};

}  // namespace

PagedReplayOptions resolved(const PagedReplayOptions& options, const PagedRecording& recording) {
  PagedReplayOptions out = options;
  if (out.page_bytes == 0) out.page_bytes = recording.page_bytes();
  if (out.cap_bytes == 0) out.cap_bytes = recording.cap_bytes();
  if (out.range_lengths == 0) out.range_lengths = PagedDeviceMemory::kRangeLengths;
  return out;
}

std::vector<PagedReplayStep> replay(const PagedRecording& recording, const PagedReplayOptions& asked) {
  const PagedReplayOptions options = resolved(asked, recording);
  if (options.page_bytes == 0 || options.cap_bytes < options.page_bytes)
    throw Error(ErrorKind::kInvalidArgument, cat("a replay needs a page and a cap of at least a page (page ",
                                                 options.page_bytes, ", cap ", options.cap_bytes, ")"));
  CountingDriver driver(options.page_bytes, options.cap_bytes, options.lag);
  PagedDeviceMemory memory(driver, options.range_lengths);
  // Streams as the recording numbered them; the handle only has to tell them apart.
  const auto stream = [](std::uint32_t number) {
    return reinterpret_cast<StreamHandle>(std::uintptr_t{number} + 1);
  };
  std::unordered_map<std::uint64_t, void*> blocks;  // live; nullptr where the replay refused it
  std::vector<PagedReplayStep> steps;
  PagedMemoryStats before = memory.stats();
  std::uint64_t refused = 0;
  const auto live = [&](const PagedRequest& r) {
    const auto found = blocks.find(r.block);
    if (found == blocks.end())
      throw Error(ErrorKind::kFormat, cat("paged request for block ", r.block, ", which is not allocated"));
    return found;
  };
  for (const PagedRequest& r : recording.requests()) {
    driver.advance();
    switch (r.kind) {
      case PagedRequest::Kind::kAllocate: {
        if (blocks.contains(r.block))
          throw Error(ErrorKind::kFormat, cat("block ", r.block, " allocated twice"));
        void* address = nullptr;
        try {
          address = memory.allocate(r.bytes, stream(r.stream));
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::kOutOfMemory) throw;
          ++refused;
        }
        blocks.emplace(r.block, address);
        break;
      }
      case PagedRequest::Kind::kFree: {
        const auto found = live(r);
        if (found->second != nullptr) memory.free(found->second);
        blocks.erase(found);
        break;
      }
      case PagedRequest::Kind::kUse: {
        const auto found = live(r);
        if (found->second != nullptr) memory.record_use(found->second, stream(r.stream));
        break;
      }
      case PagedRequest::Kind::kStep: {
        const PagedMemoryStats now = memory.stats();
        steps.push_back({counter_growth(now, before), refused, recording.counted().at(steps.size())});
        before = now;
        refused = 0;
        break;
      }
    }
  }
  // Given back before the memory goes: its destructor releases only what is freed.
  for (const auto& [block, address] : blocks)
    if (address != nullptr) memory.free(address);
  return steps;
}

}  // namespace teraio::io
