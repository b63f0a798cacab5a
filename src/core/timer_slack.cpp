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
      log::warn(e.what(), "; using ",
                format_duration(std::chrono::duration<double>(kPollingTimerSlack).count()));
      return std::optional<std::chrono::nanoseconds>(kPollingTimerSlack);
    }
  }();
  return slack;
}

std::string describe_polling_timer_slack() {
  const auto slack = polling_timer_slack();
  if (!slack) return "the kernel's timer slack";
  return cat(format_duration(std::chrono::duration<double>(*slack).count()), " timer slack");
}

void use_polling_timer_slack(std::string_view thread) {
  const auto slack = polling_timer_slack();
  if (slack && !set_timer_slack(*slack))
    log::warn(thread, ": cannot set the timer slack of a polling thread");
}

}  // namespace teraio
