// torch/callback_parts: where the host time of TeraIO's operator callbacks goes. The step
// record's callback_s is their total (the observer times each callback with TimedNs); on W3 it
// stayed at about 6 s per step after a third of the operators stopped being counted, so the
// cost sits in a few parts, not in every operator. These clocks name the parts: the executor's
// work before and after an operator, the allocations for fetches inside it, and handing
// settled memory back to storages.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace teraio::torch_binding {

// Adds the time from its construction to its end to a count of nanoseconds (any thread).
class TimedNs {
 public:
  explicit TimedNs(std::atomic<std::uint64_t>& ns) : ns_(ns), start_(std::chrono::steady_clock::now()) {}
  ~TimedNs() {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
    ns_.fetch_add(static_cast<std::uint64_t>(ns.count()), std::memory_order_relaxed);
  }
  TimedNs(const TimedNs&) = delete;
  TimedNs& operator=(const TimedNs&) = delete;

 private:
  std::atomic<std::uint64_t>& ns_;
  std::chrono::steady_clock::time_point start_;
};

enum class CallbackPart : std::size_t {
  kBeforeOp,  // Executor::before_op: planned migrations, fetches, room for the outputs
  kAfterOp,   // Executor::after_op: back under the budget after the operator
  kAllocate,  // the caching allocator, for fetches (inside the two above)
  kHandBack,  // settled transfers' memory back to their storages
};
inline constexpr std::size_t kCallbackParts = 4;
std::string_view to_string(CallbackPart part);

class CallbackParts {
 public:
  // One part's count, for a TimedNs.
  std::atomic<std::uint64_t>& ns(CallbackPart part) { return ns_[static_cast<std::size_t>(part)]; }

  // Seconds per part since the last call; starts them from zero again.
  std::array<double, kCallbackParts> take_s() {
    std::array<double, kCallbackParts> s{};
    for (std::size_t i = 0; i < kCallbackParts; ++i)
      s[i] = static_cast<double>(ns_[i].exchange(0, std::memory_order_relaxed)) * 1e-9;
    return s;
  }

 private:
  std::array<std::atomic<std::uint64_t>, kCallbackParts> ns_{};
};

inline std::string_view to_string(CallbackPart part) {
  switch (part) {
    case CallbackPart::kBeforeOp: return "before_op";
    case CallbackPart::kAfterOp: return "after_op";
    case CallbackPart::kAllocate: return "allocate";
    case CallbackPart::kHandBack: return "hand_back";
  }
  return "unknown";
}

}  // namespace teraio::torch_binding
