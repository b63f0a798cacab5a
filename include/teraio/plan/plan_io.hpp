// plan/plan_io: the plan file format (versioned JSON, documented in docs/plan-format.md) and
// the hardware description inside it. Round trips are exact (doubles are written with all
// their digits). Malformed input is rejected with Error{kFormat} naming the source, the
// field (e.g. "migrations[12].deadline") and why.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "teraio/plan/hardware.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan {

std::string plan_to_json(const Plan& plan);
// `source` names the input in error messages (a path, "<stdin>").
Plan plan_from_json(std::string_view text, std::string_view source = "<string>");

// Files; errors opening or writing name the path (Error{kIo}).
void write_plan(const Plan& plan, const std::filesystem::path& path);
Plan read_plan(const std::filesystem::path& path);

// A hardware description on its own (same fields as a plan's "hardware" object).
std::string hardware_to_json(const Hardware& hardware);
Hardware hardware_from_json(std::string_view text, std::string_view source = "<string>");

// Checks that a plan fits a trace: every migration names a tensor of the trace with its
// size and operators inside it, and every offload of a period is matched by a prefetch.
// Throws Error{kFormat} naming the first migration that does not.
void validate(const Plan& plan, const trace::Trace& trace);

}  // namespace teraio::plan
