// What the simulator looks up at every operator (internal to plan/): the plan's migrations
// issued before it, the tensors it uses, and the step-local tensors whose first or last use
// it is. Built once per simulation so that replaying a step costs O(ops + uses + migrations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "teraio/plan/plan.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan::detail {

// Items grouped by operator: those of operator k are items[begin[k] .. begin[k + 1]).
struct PerOperator {
  std::vector<std::size_t> begin;
  std::vector<std::uint32_t> items;

  std::span<const std::uint32_t> at(std::size_t k) const {
    return std::span(items).subspan(begin[k], begin[k + 1] - begin[k]);
  }
};

struct ReplayIndex {
  std::vector<std::uint32_t> migration_tensor;  // per migration: index into Trace::tensors
  PerOperator issued;                           // migration indices, in plan order
  PerOperator used;                             // tensor indices
  PerOperator first_use;                        // step-local tensor indices
  PerOperator released;                         // step-local tensor indices, after their release_op
};

// Throws Error{kInvalidArgument} for a migration naming a tensor the trace does not have or
// an operator past its end.
ReplayIndex index_replay(const trace::Trace& trace, const Plan& plan);

}  // namespace teraio::plan::detail
