// runtime/timeline: exports executed steps as Chrome trace-event JSON (opens in Perfetto or
// chrome://tracing): one track for the operators, one per transfer direction, one for the
// operator thread's stalls, on the executor's clock.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "teraio/runtime/executor.hpp"

namespace teraio::runtime {

// One operator as it ran (seconds on the executor's clock, see Executor::now_s()).
struct OpSpan {
  std::string name;
  double start_s = 0;
  double end_s = 0;
  std::uint32_t step = 0;
};

std::string timeline_json(std::span<const OpSpan> ops, std::span<const StepStats> steps);
// Writes timeline_json to `path` through a temporary file, so that a reader never sees half a
// file; throws Error{kIo} naming the path on failure.
void write_timeline(const std::string& path, std::span<const OpSpan> ops, std::span<const StepStats> steps);

}  // namespace teraio::runtime
