// Options shared by the commands that plan or simulate for a machine (plan, simulate, sweep):
// every Hardware field can be set on the command line, over a base taken from a plan or
// from the H100 figures of shared/WORKLOADS.md; and the step of a multi-step trace to use.
#pragma once

#include <cstdint>
#include <cstdio>

#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/hardware.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::cli {

// The defaults are named in the help text only, not declared as option defaults: an option
// that is not given must leave the base hardware (a plan file's) untouched.
inline void add_hardware_options(Options& opts) {
  const plan::Hardware d;
  const auto otherwise = [](const std::string& value) {
    return cat(" (default ", value, "; given a plan file, the plan's)");
  };
  opts.add("budget", "GPU memory budget for tracked tensors (e.g. 24GiB)");
  opts.add("host-capacity", "pinned host tier capacity; 0 disables it" + otherwise("0"));
  opts.add("ssd-capacity", "SSD tier capacity; 0 disables it" + otherwise("0"));
  opts.add("pcie", "PCIe bandwidth each way (sets --d2h and --h2d)");
  opts.add("d2h", "device-to-host bandwidth" + otherwise(format_bandwidth(d.d2h_bandwidth)));
  opts.add("h2d", "host-to-device bandwidth" + otherwise(format_bandwidth(d.h2d_bandwidth)));
  opts.add("pcie-duplex",
           "PCIe bandwidth of both directions together while both are busy (the simulator, the "
           "bound and the planner's booking; the H100 machines: 94GB/s); 0: each direction at its "
           "own rate" +
               otherwise("0"));
  opts.add("ssd-write",
           "SSD write bandwidth, all paths together" + otherwise(format_bandwidth(d.ssd_write_bandwidth)));
  opts.add("ssd-read",
           "SSD read bandwidth, all paths together" + otherwise(format_bandwidth(d.ssd_read_bandwidth)));
  opts.add("latency", "fixed cost per migration request" + otherwise(format_duration(d.request_latency_s)));
  opts.add_flag("gds", "SSD traffic uses GPUDirect Storage (does not cross the PCIe/host channel)");
}

inline plan::Hardware hardware_from_options(const Options& opts, plan::Hardware hw) {
  if (opts.has("budget")) hw.gpu_budget = opts.bytes("budget");
  if (opts.has("host-capacity")) hw.host_capacity = opts.bytes("host-capacity");
  if (opts.has("ssd-capacity")) hw.ssd_capacity = opts.bytes("ssd-capacity");
  if (opts.has("pcie")) hw.d2h_bandwidth = hw.h2d_bandwidth = opts.bandwidth("pcie");
  if (opts.has("d2h")) hw.d2h_bandwidth = opts.bandwidth("d2h");
  if (opts.has("h2d")) hw.h2d_bandwidth = opts.bandwidth("h2d");
  if (opts.has("pcie-duplex")) hw.pcie_duplex_bandwidth = opts.bandwidth("pcie-duplex");
  if (opts.has("ssd-write")) hw.ssd_write_bandwidth = opts.bandwidth("ssd-write");
  if (opts.has("ssd-read")) hw.ssd_read_bandwidth = opts.bandwidth("ssd-read");
  if (opts.has("latency")) hw.request_latency_s = opts.duration("latency");
  if (opts.flag("gds")) hw.gpudirect = true;
  return hw;
}

// Step `step` (the --step option) of a trace, re-indexed from 0. Plans are made for one
// step, so plan, simulate and sweep must all cut the same one.
inline trace::Trace one_step(trace::Trace t, std::int64_t step) {
  if (step < 0) throw Error(ErrorKind::kInvalidArgument, "--step must not be negative");
  if (t.step_begins.size() > 1 || step > 0) return trace::extract_step(t, static_cast<std::size_t>(step));
  return t;
}

inline void add_operator_time_options(Options& opts) {
  opts.add("time-scale",
           "multiply every operator's time by this factor: measured GPU time over the profiled step "
           "calibrates a TeraIO profile, whose operator times are inflated",
           "1");
  opts.add("jitter",
           "multiply each operator's time by its own factor in [1 - J, 1 + J], after --time-scale, as two "
           "profiles of one step differ (0: off)",
           "0");
  opts.add("seed", "the jitter's random seed", "1");
  opts.add(
      "releases",
      "recorded: the trace's releases (Session(record_releases=True)); last-use: every storage freed at "
      "its last use, as a profile without recorded releases counts it. It changes the trace this command "
      "plans and replays: to replay a last-use plan where the program frees late, plan with last-use and "
      "simulate that plan on the trace as recorded",
      "recorded");
}

// The step to plan (--step) with its operator times scaled (--time-scale) and jittered (--jitter),
// said when they are.
inline trace::Trace load_step(const Options& opts) {
  const std::string releases = opts.str("releases");  // checked before a long load
  if (releases != "recorded" && releases != "last-use")
    throw Error(ErrorKind::kInvalidArgument, cat("--releases must be recorded or last-use, not ", releases));
  trace::Trace t = one_step(trace::load_trace(*opts.positional("trace")), opts.integer("step"));
  const double factor = opts.number("time-scale");
  if (factor != 1) {
    trace::scale_durations(t, factor);
    std::printf("operator times scaled by %g\n", factor);
  }
  const double spread = opts.number("jitter");
  if (spread != 0) {
    const std::int64_t given = opts.integer("seed");
    if (given < 0) throw Error(ErrorKind::kInvalidArgument, cat("--seed must be >= 0 (got ", given, ")"));
    const auto seed = static_cast<std::uint64_t>(given);
    trace::jitter_durations(t, spread, seed);
    std::printf("operator times jittered by up to %g%% (seed %llu)\n", spread * 100,
                static_cast<unsigned long long>(seed));
  }
  if (releases == "last-use") {
    const std::size_t held = trace::free_at_last_use(t);
    std::printf("releases: every storage freed at its last use (step-local tensors held past it: %zu)\n",
                held);
  }
  return t;
}

}  // namespace teraio::cli
