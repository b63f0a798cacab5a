// core/timer_slack: how late the kernel may wake a sleeping thread of TeraIO's. Linux wakes a
// thread up to its timer slack (50 us by default) after the time it asked for, so a thread that
// polls the GPU "every 5 us" looks every ~60 us (bench_io_engine's BM_PollingPause on the
// development machine: 59.5 us, 10.5 us with a 1 us slack; a 20 us pause 74.9 and 25.3 us).
// Each late look starts a copy, or reports one done, that late.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace teraio {

// The slack of the threads that poll copies (the copier's dispatchers, the tier store's
// watchers) unless TERAIO_POLL_SLACK says otherwise. Small enough that a 5-20 us pause means
// what it says, large enough to let the kernel batch the wake-ups of a few threads.
inline constexpr std::chrono::nanoseconds kPollingTimerSlack{1000};

// Sets the calling thread's timer slack. Returns whether it took effect (false where the
// platform has no such setting).
bool set_timer_slack(std::chrono::nanoseconds slack);

// The calling thread's timer slack, where the platform says.
std::optional<std::chrono::nanoseconds> timer_slack();

// TERAIO_POLL_SLACK's value: a duration ("1us", "50us") or "kernel" (leave the slack the thread
// inherits: nullopt). Unset or empty: kPollingTimerSlack. Throws Error{kInvalidArgument} naming
// the text otherwise.
std::optional<std::chrono::nanoseconds> parse_polling_timer_slack(const char* text);

// The polling threads' slack for this process, read from the environment once; a bad value is
// a warning and the default.
std::optional<std::chrono::nanoseconds> polling_timer_slack();

// The slack a group of polling threads (one component's) runs with, as each thread reads it
// back itself: what a report states is what took effect, not what was asked.
class PollingSlack {
 public:
  // Called by each polling thread as it starts: sets polling_timer_slack() (warning once per
  // process if the platform refuses) and records what the thread then has.
  void start();
  // "1 us timer slack", "timer slack 1 us to 50 us" (threads differ), "timer slack unknown"
  // (the platform does not say), or "timer slack not yet known (threads starting)".
  std::string describe() const;
  // The slack every started thread read back, if they agree and the platform says.
  std::optional<std::chrono::nanoseconds> common() const;
  // Threads that have called start().
  int started() const { return started_.load(); }

 private:
  std::atomic<int> started_{0};
  std::atomic<std::int64_t> least_ns_{INT64_MAX};
  std::atomic<std::int64_t> most_ns_{-1};
  std::atomic<bool> unknown_{false};
};

}  // namespace teraio
