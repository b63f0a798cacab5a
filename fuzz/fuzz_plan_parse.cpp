// Feeds arbitrary bytes to the plan reader. A teraio::Error{kFormat} is the expected answer
// to bad input; anything else (a crash, a sanitizer report, another exception) is a bug.
// Accepted input must survive a write/read round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "teraio/core/error.hpp"
#include "teraio/plan/plan_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  teraio::plan::Plan plan;
  try {
    plan = teraio::plan::plan_from_json(text, "fuzz");
  } catch (const teraio::Error& e) {
    if (e.kind() != teraio::ErrorKind::kFormat) throw;
    return 0;
  }
  const std::string written = teraio::plan::plan_to_json(plan);
  TERAIO_ASSERT(teraio::plan::plan_to_json(teraio::plan::plan_from_json(written, "round trip")) == written);
  return 0;
}
