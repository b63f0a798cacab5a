// Options shared by the commands that simulate or plan for a machine (simulate, sweep):
// every Hardware field can be set on the command line, over a base taken from a plan or
// from the H100 figures of shared/WORKLOADS.md.
#pragma once

#include "teraio/core/options.hpp"
#include "teraio/plan/hardware.hpp"

namespace teraio::cli {

inline void add_hardware_options(Options& opts) {
  opts.add("budget", "GPU memory budget for tracked tensors (e.g. 24GiB)");
  opts.add("host-capacity", "pinned host tier capacity (0 disables it)");
  opts.add("ssd-capacity", "SSD tier capacity (0 disables it)");
  opts.add("pcie", "PCIe bandwidth each way (sets --d2h and --h2d)");
  opts.add("d2h", "device-to-host bandwidth (e.g. 55GB/s)");
  opts.add("h2d", "host-to-device bandwidth");
  opts.add("ssd-write", "SSD write bandwidth, all paths together");
  opts.add("ssd-read", "SSD read bandwidth, all paths together");
  opts.add("latency", "fixed cost per migration request (e.g. 20us)");
  opts.add_flag("gds", "SSD traffic uses GPUDirect Storage (does not cross the PCIe/host channel)");
}

inline plan::Hardware hardware_from_options(const Options& opts, plan::Hardware hw) {
  if (opts.has("budget")) hw.gpu_budget = opts.bytes("budget");
  if (opts.has("host-capacity")) hw.host_capacity = opts.bytes("host-capacity");
  if (opts.has("ssd-capacity")) hw.ssd_capacity = opts.bytes("ssd-capacity");
  if (opts.has("pcie")) hw.d2h_bandwidth = hw.h2d_bandwidth = opts.bandwidth("pcie");
  if (opts.has("d2h")) hw.d2h_bandwidth = opts.bandwidth("d2h");
  if (opts.has("h2d")) hw.h2d_bandwidth = opts.bandwidth("h2d");
  if (opts.has("ssd-write")) hw.ssd_write_bandwidth = opts.bandwidth("ssd-write");
  if (opts.has("ssd-read")) hw.ssd_read_bandwidth = opts.bandwidth("ssd-read");
  if (opts.has("latency")) hw.request_latency_s = opts.duration("latency");
  if (opts.flag("gds")) hw.gpudirect = true;
  return hw;
}

}  // namespace teraio::cli
