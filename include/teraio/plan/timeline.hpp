// plan/timeline: exports a simulated step as Chrome trace-event JSON, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one track for the compute stream with every
// operator, one track per migration channel with its transfers, and counter tracks for
// device memory against the budget.
#pragma once

#include <string>

#include "teraio/plan/plan.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan {

// `result` must come from simulate(..., {.record_timeline = true}); its timeline is empty otherwise.
std::string timeline_to_json(const trace::Trace& trace, const Plan& plan, const SimulationResult& result);
// Writes timeline_to_json to `path`; throws Error{kIo} naming the path on failure.
void write_timeline(const trace::Trace& trace, const Plan& plan, const SimulationResult& result,
                    const std::string& path);

}  // namespace teraio::plan
