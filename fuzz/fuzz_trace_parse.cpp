// Feeds arbitrary bytes to both trace readers. A teraio::Error is the expected answer to bad
// input; anything else (a crash, a sanitizer report, another exception escaping) is a bug.
// Accepted input must also survive a save/load round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "teraio/core/error.hpp"
#include "teraio/trace/characterize.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace {

// Lifetime analysis must cope with anything the readers accept, and both writers must
// reproduce it. Only JSON input is known to hold UTF-8 names, which the JSON form needs.
// Input that was accepted can make no error legitimate here, so any is reported as a bug.
void check_accepted(const teraio::trace::Trace& trace, bool utf8_names) {
  using namespace teraio::trace;
  try {
    (void)inactive_periods(trace);
    (void)memory_demand(trace);
    (void)characterize(trace);
    for (std::size_t step = 0; step < trace.step_begins.size(); ++step) validate(extract_step(trace, step));
    TERAIO_ASSERT(parse_trace_binary(trace_to_binary(trace)) == trace);
    if (utf8_names) TERAIO_ASSERT(parse_trace_json(trace_to_json(trace)) == trace);
  } catch (const teraio::Error& e) {
    if (e.kind() == teraio::ErrorKind::kInternal) throw;
    teraio::throw_internal(e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    check_accepted(teraio::trace::parse_trace_binary(bytes), false);
  } catch (const teraio::Error& e) {
    if (e.kind() == teraio::ErrorKind::kInternal) throw;
  }
  try {
    check_accepted(
        teraio::trace::parse_trace_json(std::string_view(reinterpret_cast<const char*>(data), size)), true);
  } catch (const teraio::Error& e) {
    if (e.kind() == teraio::ErrorKind::kInternal) throw;
  }
  return 0;
}
