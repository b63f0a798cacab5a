// Options shared by the commands that plan (plan, simulate): the stall search's settings.
#pragma once

#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/plan/planner.hpp"

namespace teraio::cli {

inline void add_stall_options(Options& opts) {
  const plan::PlannerOptions d;
  opts.add("stall-rounds",
           "where no stall-free plan fits, rounds of planned waits to search (0: leave the shortfall to "
           "reactive eviction)",
           cat(d.stall_rounds));
  opts.add("stall-damping", "share of the missing transfer time one stall round adds", cat(d.stall_damping));
  opts.add("stall-patience",
           "rounds in a row with neither a shorter simulated step nor a new low of the bytes over budget "
           "before the stall search stops",
           cat(d.stall_patience));
}

inline void apply_stall_options(const Options& opts, plan::PlannerOptions& po) {
  po.stall_rounds = static_cast<int>(opts.integer("stall-rounds"));
  po.stall_damping = opts.number("stall-damping");
  po.stall_patience = static_cast<int>(opts.integer("stall-patience"));
  if (po.stall_rounds < 0) throw Error(ErrorKind::kInvalidArgument, "--stall-rounds must be >= 0");
  if (po.stall_patience < 1) throw Error(ErrorKind::kInvalidArgument, "--stall-patience must be >= 1");
  if (!(po.stall_damping > 0) || po.stall_damping > 10)
    throw Error(ErrorKind::kInvalidArgument, "--stall-damping must be in (0, 10]");
}

}  // namespace teraio::cli
