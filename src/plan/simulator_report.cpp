#include <algorithm>
#include <cstdio>
#include <numeric>

#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/simulator.hpp"

namespace teraio::plan {

std::string_view to_string(Channel channel) {
  switch (channel) {
    case Channel::kD2h: return "pcie_d2h";
    case Channel::kH2d: return "pcie_h2d";
    case Channel::kSsdWrite: return "ssd_write";
    case Channel::kSsdRead: return "ssd_read";
  }
  return "pcie_d2h";
}

std::string_view to_string(ViolationKind kind) {
  switch (kind) {
    case ViolationKind::kOverBudget: return "over_budget";
    case ViolationKind::kNotResident: return "not_resident";
    case ViolationKind::kHostOverCap: return "host_over_capacity";
    case ViolationKind::kSsdOverCap: return "ssd_over_capacity";
    case ViolationKind::kInconsistent: return "inconsistent_migration";
  }
  return "over_budget";
}

bool SimulationResult::ok() const {
  return violation_count() == 0;
}

std::size_t SimulationResult::violation_count() const {
  return std::accumulate(violation_counts.begin(), violation_counts.end(), std::size_t{0});
}

std::string SimulationResult::describe(const trace::Trace& trace) const {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%", 100.0 * share_of_ideal);
  line(cat("step time        ", format_duration(step_time_s), " (step ", steps, " of ", steps, "), ideal ",
           format_duration(ideal_step_time_s), ": ", share, " of ideal"));
  line(cat("stall            ", format_duration(stall_s), " over ",
           std::count_if(stall_per_op.begin(), stall_per_op.end(), [](double s) { return s > 0; }),
           " operators"));
  for (const OpStall& s : top_stalls)
    line(cat("  ", format_duration(s.stall_s), " before operator ", s.op, " (",
             s.op < trace.ops.size() ? trace.ops[s.op].name : std::string("?"), ")"));
  line(cat("device memory    peak ", format_bytes(peak_memory), " at operator ", peak_op, ", budget ",
           format_bytes(budget), peak_memory > budget ? "  OVER BUDGET" : ""));
  for (std::size_t c = 0; c < kChannelCount; ++c) {
    char util[32];
    std::snprintf(util, sizeof util, "%.1f%%", 100.0 * channels[c].utilization);
    line(cat("channel ", to_string(static_cast<Channel>(c)),
             std::string(10 - to_string(static_cast<Channel>(c)).size(), ' '), util, " busy, ",
             format_bytes(channels[c].bytes), " in ", channels[c].requests, " requests"));
  }
  line(cat("host tier        offload ", format_bytes(tier_bytes[0][0]), ", prefetch ",
           format_bytes(tier_bytes[0][1]), ", peak ", format_bytes(host_peak)));
  line(cat("ssd tier         offload ", format_bytes(tier_bytes[1][0]), ", prefetch ",
           format_bytes(tier_bytes[1][1]), ", peak ", format_bytes(ssd_peak)));
  if (demand_fetches > 0)
    line(cat("demand fetches   ", demand_fetches, " (", format_bytes(demand_fetch_bytes), ")"));
  if (evictions > 0)
    line(cat("evictions        ", evictions, " (", format_bytes(eviction_bytes), ") to keep the budget"));
  if (dropped > 0)
    line(cat("dropped          ", dropped, " (", format_bytes(dropped_bytes),
             ") whose tier kept an unchanged copy: nothing copied out"));
  if (skipped_migrations > 0)
    line(cat("skipped          ", skipped_migrations, " migrations found nothing to move"));
  if (ok()) {
    line("invariants       all hold");
  } else {
    std::string counts;
    for (std::size_t k = 0; k < kViolationKindCount; ++k)
      if (violation_counts[k] > 0)
        counts += cat(counts.empty() ? "" : ", ", violation_counts[k], " ",
                      to_string(static_cast<ViolationKind>(k)));
    line(cat("VIOLATIONS       ", violation_count(), ": ", counts));
    for (std::size_t i = 0; i < violations.size() && i < 20; ++i)
      line(cat("  step ", violations[i].step, ": ", violations[i].message));
  }
  return out;
}

}  // namespace teraio::plan
