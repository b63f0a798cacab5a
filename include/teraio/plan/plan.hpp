// plan/plan: a migration plan — which tensors leave device memory, to which tier, when they
// leave and when they must be back — keyed by operator index so that the runtime can carry
// it out on every later step. Times are expressed as "before operator k starts".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "teraio/plan/hardware.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan {

enum class Direction : std::uint8_t { kOffload, kPrefetch };
enum class Tier : std::uint8_t { kHost, kSsd };

std::string_view to_string(Direction direction);
std::string_view to_string(Tier tier);

struct Migration {
  trace::TensorId tensor = 0;
  std::uint64_t bytes = 0;
  Direction direction = Direction::kOffload;
  Tier tier = Tier::kSsd;  // destination of an offload, source of a prefetch
  // Issued just before operator `issue_before` starts (for an offload: the operator after
  // the tensor's last use; for a prefetch: the latest start that still meets the deadline).
  trace::OpIndex issue_before = 0;
  // Must be complete before operator `deadline` starts (for a prefetch: the next use).
  // A deadline smaller than issue_before wraps into the next step (persistent tensors).
  trace::OpIndex deadline = 0;
  // Must finish before the very next operator: served ahead of every other migration.
  bool urgent = false;
  // The tier keeps an unchanged copy of the tensor across its time on the device (only the
  // uses between read it: trace::Tensor::read_only_uses). On a prefetch: the tier's copy stays
  // after the fetch. On an offload: the device memory is dropped and nothing is copied, since
  // the tier already holds these bytes from the tensor's previous prefetch.
  bool kept_copy = false;

  bool operator==(const Migration&) const = default;
};

struct Plan {
  static constexpr int kFormatVersion = 1;
  Hardware hardware;                  // what it was planned for
  std::uint64_t peak_before = 0;      // peak memory demand without migrations (bytes)
  std::uint64_t peak_after = 0;       // peak memory demand the plan reaches (bytes)
  bool feasible = false;              // peak_after <= hardware.gpu_budget
  std::vector<Migration> migrations;  // sorted by issue_before, then tensor
};

}  // namespace teraio::plan
