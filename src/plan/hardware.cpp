#include "teraio/plan/hardware.hpp"

#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/plan.hpp"

namespace teraio::plan {

std::string Hardware::describe() const {
  return cat("budget ", format_bytes(gpu_budget), ", host tier ", format_bytes(host_capacity), ", SSD tier ",
             format_bytes(ssd_capacity), ", PCIe d2h ", format_bandwidth(d2h_bandwidth), " h2d ",
             format_bandwidth(h2d_bandwidth),
             pcie_duplex_bandwidth > 0 ? cat(", both at once ", format_bandwidth(pcie_duplex_bandwidth)) : "",
             ", SSD write ", format_bandwidth(ssd_write_bandwidth), " read ",
             format_bandwidth(ssd_read_bandwidth), gpudirect ? ", GPUDirect" : ", bounce through host", ", ",
             format_duration(request_latency_s), " a request");
}

std::string_view to_string(Direction direction) {
  return direction == Direction::kOffload ? "offload" : "prefetch";
}

std::string_view to_string(Tier tier) {
  return tier == Tier::kHost ? "host" : "ssd";
}

}  // namespace teraio::plan
