// core/timer_slack: how late the kernel may wake a sleeping thread of TeraIO's. Linux wakes a
// thread up to its timer slack (50 us by default) after the time it asked for, so a thread that
// polls the GPU "every 5 us" looks every ~60 us: sleep_for(5 us) took 59 us on the development
// machine, 8.8 us with a 1 us slack. Each late look starts a copy, or reports one done, that late.
#pragma once

#include <chrono>
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

// "1.00 us timer slack" or "the kernel's timer slack", for the reports.
std::string describe_polling_timer_slack();

// Called by a polling thread as it starts; warns, naming `thread`, if the slack cannot be set.
void use_polling_timer_slack(std::string_view thread);

}  // namespace teraio
