// Checks every entry point of plan/ makes on the trace it is given (internal to plan/).
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan::detail {

// Validates the trace, reporting a bad one as the caller's error, and checks that its memory
// adds up to what the planner's signed byte counts (memory curves that go down as tensors
// leave) can hold: the file formats accept any 64-bit sizes.
inline void require_plannable(const trace::Trace& trace, std::string_view who) {
  try {
    trace::validate(trace);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidArgument, cat(who, ": invalid trace: ", e.what()));
  }
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t total = trace.untracked_bytes;
  for (const trace::Tensor& t : trace.tensors) {
    if (total > kMax || t.bytes > kMax - total)
      throw Error(ErrorKind::kInvalidArgument,
                  cat(who, ": the trace's untracked bytes and tensor sizes add up to more than ", kMax,
                      " bytes (at tensor ", t.id, " of ", t.bytes, " bytes)"));
    total += t.bytes;
  }
  if (total > kMax)
    throw Error(ErrorKind::kInvalidArgument,
                cat(who, ": the trace's untracked bytes ", trace.untracked_bytes, " exceed ", kMax));
}

}  // namespace teraio::plan::detail
