// runtime/executor_against_plan: the debug log's account of an eviction in a planned step,
// what the device holds beyond the plan's memory there (see executor_state.hpp).
#include <algorithm>

#include "executor_state.hpp"

namespace teraio::runtime {

using namespace executor_detail;

namespace {

using Move = std::pair<OpIndex, plan::Direction>;

// The plan's last migration of a tensor issued by operator `op`, from its migrations by issue
// point (ties in the order the executor issues them). Before the first of them a persistent
// tensor is where the step before left it (its step's last migration, as away_at_start has it);
// a step-local one is on the device, or not born yet. Null where the plan has not moved it.
const Move* last_move(const std::vector<Move>& list, OpIndex op, bool persistent) {
  const auto after = std::upper_bound(list.begin(), list.end(), op,
                                      [](OpIndex k, const Move& move) { return k < move.first; });
  if (after != list.begin()) return &*(after - 1);
  return persistent && !list.empty() ? &list.back() : nullptr;
}

// A sum of tensors and the largest of them.
struct Share {
  std::uint64_t bytes = 0;
  std::size_t tensors = 0;
  TensorId largest = 0;
  std::uint64_t largest_bytes = 0;

  void add(TensorId id, std::uint64_t b) {
    bytes += b;
    ++tensors;
    if (b > largest_bytes) {
      largest = id;
      largest_bytes = b;
    }
  }
};

}  // namespace

bool Executor::State::plan_has_away(TensorId id, OpIndex op) const {
  const auto found = moves.find(id);
  if (found == moves.end()) return false;
  const Move* last = last_move(found->second, op, next_uses.persistent(id));
  return last != nullptr && last->second == plan::Direction::kOffload;
}

namespace {

// Calls `each(id, bytes)` for every tensor on the device that the program holds past its
// profiled release at operator `op` and the plan does not have away.
template <typename State, typename Each>
void for_each_late(const State& s, OpIndex op, Each&& each) {
  // after_op(k) lists the tensors the profile saw freed by the end of operator k before it makes
  // room, but the program frees them after it returns: those are not late yet.
  const std::span<const TensorId> due_now =
      s.releasing_after ? s.next_uses.released_at(*s.releasing_after) : std::span<const TensorId>{};
  for (const TensorId id : s.released) {
    const auto found = s.entries.find(id);
    if (found == s.entries.end() || !State::occupies_device(found->second)) continue;
    // Freed ones are only forgotten where make_room was over the budget before (forget_released).
    if (s.plan_has_away(id, op) || contains_id(due_now, id) || !s.memory.alive(id)) continue;
    each(id, found->second.bytes);
  }
}

}  // namespace

std::uint64_t Executor::State::late_bytes(OpIndex op) const {
  std::uint64_t bytes = 0;
  for_each_late(*this, op, [&](TensorId, std::uint64_t b) { bytes += b; });
  return bytes;
}

std::string Executor::State::against_plan(OpIndex op) const {
  // One share per tensor, in this order: the plan has it away, the program holds it past its
  // profiled release, the profile does not know it.
  Share away;
  Share unknown;
  for (const auto& [id, e] : entries) {
    if (!occupies_device(e)) continue;
    if (plan_has_away(id, op)) {
      away.add(id, e.bytes);
    } else if (next_uses.first(id) == NextUses::kNever) {
      unknown.add(id, e.bytes);
    }
  }
  // make_room has just forgotten the freed ones among these: the rest the program still holds.
  Share late;
  for_each_late(*this, op, [&](TensorId id, std::uint64_t b) { late.add(id, b); });
  if (away.tensors + late.tensors + unknown.tensors == 0)
    return "; against the plan: nothing on the device beyond it";
  std::string text =
      cat("; against the plan: ", away.bytes, " bytes in ", away.tensors, " tensors the plan has away here");
  if (away.tensors > 0) {
    const Entry& e = entries.at(away.largest);
    const Move* out = last_move(moves.at(away.largest), op, next_uses.persistent(away.largest));
    text +=
        cat(" (largest: tensor ", away.largest, ", ", away.largest_bytes, " bytes, ", to_string(e.location),
            ", planned out before operator ", out->first, out->first > op ? " of the step before" : "", ")");
  }
  text += cat(", ", late.bytes, " bytes in ", late.tensors, " past their profiled release");
  if (late.tensors > 0) text += cat(" (largest: tensor ", late.largest, ")");
  text += cat(", ", unknown.bytes, " bytes in ", unknown.tensors, " the profile does not know");
  if (unknown.tensors > 0) text += cat(" (largest: tensor ", unknown.largest, ")");
  return text;
}

}  // namespace teraio::runtime
