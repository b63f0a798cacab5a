#include "teraio/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "teraio/core/error.hpp"

namespace teraio::log {
namespace {

Level initial_level() {
  const char* text = std::getenv("TERAIO_LOG_LEVEL");
  if (text == nullptr || *text == '\0') return Level::kWarn;
  try {
    return parse_level(text);
  } catch (const Error&) {
    return Level::kWarn;
  }
}

std::atomic<Level>& current_level() {
  static std::atomic<Level> level{initial_level()};
  return level;
}

struct SinkSlot {
  std::mutex mutex;
  Sink sink;
};

SinkSlot& sink_slot() {
  static SinkSlot slot;
  return slot;
}

const char* tag(Level level) {
  switch (level) {
    case Level::kError: return "error";
    case Level::kWarn: return "warn";
    case Level::kInfo: return "info";
    case Level::kDebug: return "debug";
  }
  return "?";
}

}  // namespace

void set_level(Level level) {
  current_level().store(level);
}
Level level() {
  return current_level().load();
}
bool enabled(Level at) {
  return static_cast<int>(at) <= static_cast<int>(level());
}

void set_sink(Sink sink) {
  std::lock_guard lock(sink_slot().mutex);
  sink_slot().sink = std::move(sink);
}

void write(Level at, std::string_view message) {
  SinkSlot& slot = sink_slot();
  std::lock_guard lock(slot.mutex);
  if (slot.sink) {
    slot.sink(at, message);
    return;
  }
  std::fprintf(stderr, "teraio %s: %.*s\n", tag(at), static_cast<int>(message.size()), message.data());
}

Level parse_level(std::string_view text) {
  const std::string lower = to_lower(trim(text));
  if (lower == "error") return Level::kError;
  if (lower == "warn" || lower == "warning") return Level::kWarn;
  if (lower == "info") return Level::kInfo;
  if (lower == "debug") return Level::kDebug;
  throw Error(ErrorKind::kInvalidArgument,
              cat("unknown log level '", text, "' (use error, warn, info or debug)"));
}

}  // namespace teraio::log
