#include "teraio/core/timer_slack.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace teraio {

namespace {

std::string format_slack(std::int64_t ns) {
  return format_duration(static_cast<double>(ns) * 1e-9);
}

}  // namespace

bool set_timer_slack(std::chrono::nanoseconds slack) {
#if defined(__linux__)
  // 0 would mean "the thread's default slack" to the kernel, not "none".
  const unsigned long ns = slack.count() > 0 ? static_cast<unsigned long>(slack.count()) : 1ul;
  return prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0;
#else
  static_cast<void>(slack);
  return false;
#endif
}

std::optional<std::chrono::nanoseconds> timer_slack() {
#if defined(__linux__)
  // prctl returns an int: a slack above ~2.1 s would not fit, and none here is near that.
  const int ns = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  if (ns >= 0) return std::chrono::nanoseconds(ns);
#endif
  return std::nullopt;
}

std::optional<std::chrono::nanoseconds> parse_polling_timer_slack(const char* text) {
  if (text == nullptr || *text == '\0') return kPollingTimerSlack;
  const std::string_view value(text);
  if (value == "kernel") return std::nullopt;
  const auto refuse = [&] {
    return Error(
        ErrorKind::kInvalidArgument,
        cat("TERAIO_POLL_SLACK '", value, "': expected a duration above 0 and at most 1ms, or 'kernel'"));
  };
  double seconds = 0;
  try {
    seconds = parse_duration(value);
  } catch (const Error&) {
    throw refuse();
  }
  // The kernel takes whole nanoseconds; a millisecond of slack would make polling pointless.
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > 1e-3) throw refuse();
  return std::chrono::nanoseconds(std::max<long long>(1, std::llround(seconds * 1e9)));
}

std::optional<std::chrono::nanoseconds> polling_timer_slack() {
  static const std::optional<std::chrono::nanoseconds> slack = [] {
    try {
      return parse_polling_timer_slack(std::getenv("TERAIO_POLL_SLACK"));
    } catch (const Error& e) {
      log::warn(e.what(), "; using ", format_slack(kPollingTimerSlack.count()));
      return std::optional<std::chrono::nanoseconds>(kPollingTimerSlack);
    }
  }();
  return slack;
}

void PollingSlack::start() {
  if (const auto slack = polling_timer_slack(); slack && !set_timer_slack(*slack)) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      log::warn(
          "cannot set the timer slack of TeraIO's polling threads: their pauses may last longer than asked");
    }
  }
  if (const auto now = timer_slack()) {
    const std::int64_t ns = now->count();
    std::int64_t least = least_ns_.load();
    while (ns < least && !least_ns_.compare_exchange_weak(least, ns)) {
    }
    std::int64_t most = most_ns_.load();
    while (ns > most && !most_ns_.compare_exchange_weak(most, ns)) {
    }
  } else {
    unknown_ = true;
  }
  ++started_;
}

std::optional<std::chrono::nanoseconds> PollingSlack::common() const {
  // A thread that started and could not say sets unknown_; otherwise least and most are set.
  const std::int64_t least = least_ns_.load();
  if (started_.load() == 0 || unknown_.load() || least != most_ns_.load()) return std::nullopt;
  return std::chrono::nanoseconds(least);
}

std::string PollingSlack::describe() const {
  if (started_.load() == 0) return "timer slack not yet known (threads starting)";
  if (unknown_.load()) return "timer slack unknown";
  const std::int64_t least = least_ns_.load();
  const std::int64_t most = most_ns_.load();
  if (least == most) return cat(format_slack(least), " timer slack");
  return cat("timer slack ", format_slack(least), " to ", format_slack(most));
}

}  // namespace teraio
