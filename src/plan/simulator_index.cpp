#include "simulator_index.hpp"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::plan::detail {
namespace {

// Groups (operator, item) pairs by operator, keeping their order within an operator.
PerOperator group(std::size_t ops, const std::vector<std::pair<trace::OpIndex, std::uint32_t>>& pairs) {
  PerOperator out;
  out.begin.assign(ops + 1, 0);
  for (const auto& [k, item] : pairs) ++out.begin[k + 1];
  for (std::size_t k = 0; k < ops; ++k) out.begin[k + 1] += out.begin[k];
  out.items.resize(pairs.size());
  std::vector<std::size_t> fill(out.begin.begin(), out.begin.end() - 1);
  for (const auto& [k, item] : pairs) out.items[fill[k]++] = item;
  return out;
}

}  // namespace

ReplayIndex index_replay(const trace::Trace& trace, const Plan& plan) {
  const std::size_t n = trace.ops.size();
  std::unordered_map<trace::TensorId, std::uint32_t> by_id;
  by_id.reserve(trace.tensors.size());
  for (std::size_t i = 0; i < trace.tensors.size(); ++i)
    by_id.emplace(trace.tensors[i].id, static_cast<std::uint32_t>(i));

  ReplayIndex index;
  index.migration_tensor.resize(plan.migrations.size());
  std::vector<std::pair<trace::OpIndex, std::uint32_t>> issued;
  issued.reserve(plan.migrations.size());
  for (std::size_t m = 0; m < plan.migrations.size(); ++m) {
    const Migration& mig = plan.migrations[m];
    const auto it = by_id.find(mig.tensor);
    if (it == by_id.end())
      throw Error(ErrorKind::kInvalidArgument,
                  cat("plan migration ", m, " names tensor ", mig.tensor, " that the trace does not have"));
    if (mig.issue_before >= n || mig.deadline >= n)
      throw Error(
          ErrorKind::kInvalidArgument,
          cat("plan migration ", m, " (tensor ", mig.tensor, ") points to operator ",
              std::max(mig.issue_before, mig.deadline), " past the last operator ", n == 0 ? 0 : n - 1));
    index.migration_tensor[m] = it->second;
    issued.emplace_back(mig.issue_before, static_cast<std::uint32_t>(m));
  }
  index.issued = group(n, issued);

  std::vector<std::pair<trace::OpIndex, std::uint32_t>> used, first, last;
  for (std::size_t i = 0; i < trace.tensors.size(); ++i) {
    const trace::Tensor& t = trace.tensors[i];
    const auto ti = static_cast<std::uint32_t>(i);
    for (const trace::OpIndex k : t.uses) used.emplace_back(k, ti);
    if (!t.persistent && !t.uses.empty()) {
      first.emplace_back(t.uses.front(), ti);
      last.emplace_back(trace::release_op(t), ti);
    }
  }
  index.used = group(n, used);
  index.first_use = group(n, first);
  index.released = group(n, last);
  return index;
}

}  // namespace teraio::plan::detail
