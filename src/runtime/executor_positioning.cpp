// runtime/executor_positioning: the first step of a new plan starts where the plan's steady
// state does (Executor::position_for_plan, executor_state.hpp).
#include <algorithm>
#include <unordered_set>

#include "executor_state.hpp"
#include "teraio/core/log.hpp"

namespace teraio::runtime {

using namespace executor_detail;

void Executor::State::position_for_plan() {
  for (const plan::Migration& m : away_at_start) {
    if (!next_uses.persistent(m.tensor)) continue;
    auto found = entries.find(m.tensor);
    if (found == entries.end() || found->second.location != Location::kDevice || found->second.bytes == 0)
      continue;
    if (!memory.alive(m.tensor)) {
      forget(found);
      continue;
    }
    // Urgent, as an eviction: the plan counts their memory free from the first operator. A
    // tier without room leaves the tensor where it is; the step then evicts as before.
    if (start_offload(m.tensor, found->second, tier_kind(m.tier), nullptr)) {
      ++stats.positioned;
      log::debug("positioning: offload of tensor ", m.tensor, " (", found->second.bytes, " bytes)");
    }
  }
  // The other half: a reactive step before this one left its evictions away, tensors the plan
  // has on the device here and fetches for no operator of the step (W3's first planned step:
  // 111 demand fetches in its first micro-batch, 1.3 s). In the order of first use, so that the
  // copies finish in the order the operators need them; no eviction for them, as they would
  // push out what the plan keeps.
  std::unordered_set<TensorId> away;
  for (const plan::Migration& m : away_at_start) away.insert(m.tensor);
  std::vector<std::pair<std::uint64_t, TensorId>> back;
  std::vector<TensorId> leaving;  // still on their way out from the step before
  std::uint64_t plan_start = 0;   // what the plan holds on the device at every step's start
  for (const auto& [id, e] : entries) {
    if (!next_uses.persistent(id) || away.contains(id)) continue;
    plan_start += e.bytes;
    const bool offloading = e.location == Location::kOffloading;
    if ((e.location != Location::kHost && e.location != Location::kSsd && !offloading) || e.bytes == 0)
      continue;
    // One the plan sends out before its first use (used last at the step's end) would go straight
    // back: the plan's own prefetch brings it.
    const std::uint64_t first = next_uses.first(id);
    if (const auto leaves = leaves_first.find(id); leaves != leaves_first.end() && leaves->second <= first)
      continue;
    if (offloading) {
      leaving.push_back(id);
    } else {
      back.emplace_back(first, id);
    }
  }
  // A plan that starts over the budget (a plan_filter's, or one that leaves the shortfall to
  // reactive eviction from the first operator) cannot be followed from its start: filling the
  // budget with its tensors would leave the first operators' outputs no room but evictions.
  if (config.budget != 0 && plan_start > config.budget) {
    back.clear();
    leaving.clear();
  }
  // An offload the step before left in flight, of a tensor the plan keeps: taken back, it stays
  // (its memory still counts as resident), where the room check below could finish it and its
  // first use fetch it again. On CUDA's device-side path nothing waits; otherwise (an SSD
  // tier's copy, the host copier) the host waits here for the copy out to end, then keeps the
  // tensor where it is.
  for (const TensorId id : leaving) {
    if (!memory.alive(id)) continue;  // freed meanwhile: forgotten when next picked or swept
    take_back(id, entries.at(id), current_op);
    ++stats.positioned_back;
    log::debug("positioning: offload of tensor ", id, " taken back");
  }
  std::sort(back.begin(), back.end());
  for (const auto& [first, id] : back) {
    // A fetch below can forget freed tensors (allocate): look each one up again.
    const auto found = entries.find(id);
    if (found == entries.end() || !memory.alive(id)) continue;  // forgotten when next picked or swept
    Entry& e = found->second;
    if (!fits_after_offloads(e.bytes)) break;
    // Ordered on the lane as a prefetch due at its first use.
    plan::Migration due;
    due.tensor = id;
    due.bytes = e.bytes;
    due.direction = plan::Direction::kPrefetch;
    due.tier = e.extent && e.extent->tier == io::TierKind::kSsd ? plan::Tier::kSsd : plan::Tier::kHost;
    due.deadline = static_cast<OpIndex>(first);
    due.urgent = true;
    const auto kept = kept_at_start.find(id);
    due.kept_copy = kept != kept_at_start.end() && kept->second == due.tier;
    // An allocator that refuses the block ends it: making room would move out what the plan keeps.
    if (!start_fetch(id, e, &due, std::span<const TensorId>(&id, 1), false)) {
      log::debug("positioning: the allocator refused the block of tensor ", id, " (", e.bytes, " bytes)");
      break;
    }
    ++stats.positioned_back;
    log::debug("positioning: fetch of tensor ", id, " (", e.bytes, " bytes) for its first use at operator ",
               first, ": ", resident, " resident");
  }
}

bool Executor::State::fits_after_offloads(std::uint64_t bytes) {
  if (config.budget == 0) return true;
  // Whether it can fit at all once every offload under way is done: if not, nothing is waited for.
  std::uint64_t leaving = 0;
  for (const TensorId id : in_flight) {
    const Entry& e = entries.at(id);
    if (e.location == Location::kOffloading) leaving += e.bytes;
  }
  if (resident - std::min(resident, leaving) + bytes > config.budget) return false;
  return free_down_to(current_op, {}, bytes, config.budget, bytes, false);
}

}  // namespace teraio::runtime
