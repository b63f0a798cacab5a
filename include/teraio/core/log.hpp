// core/log: the one logger of TeraIO. Messages go to one sink (stderr by default; the Python
// binding installs its own), filtered by a level taken from TERAIO_LOG_LEVEL
// (error, warn, info, debug) or set by the host program. Thread-safe.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "teraio/core/strings.hpp"

namespace teraio::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

using Sink = std::function<void(Level, std::string_view)>;

void set_level(Level level);
Level level();
bool enabled(Level level);
// Replaces the sink; an empty function restores the stderr sink.
void set_sink(Sink sink);
void write(Level level, std::string_view message);
Level parse_level(std::string_view text);

template <typename... Parts>
void error(const Parts&... parts) {
  if (enabled(Level::kError)) write(Level::kError, cat(parts...));
}
template <typename... Parts>
void warn(const Parts&... parts) {
  if (enabled(Level::kWarn)) write(Level::kWarn, cat(parts...));
}
template <typename... Parts>
void info(const Parts&... parts) {
  if (enabled(Level::kInfo)) write(Level::kInfo, cat(parts...));
}
template <typename... Parts>
void debug(const Parts&... parts) {
  if (enabled(Level::kDebug)) write(Level::kDebug, cat(parts...));
}

}  // namespace teraio::log
