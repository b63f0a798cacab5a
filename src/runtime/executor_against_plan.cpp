// runtime/executor_against_plan: the debug log's account of an eviction in a planned step,
// what the device holds beyond the plan's memory there (see executor_state.hpp).
#include <algorithm>

#include "executor_state.hpp"

namespace teraio::runtime {

using namespace executor_detail;

namespace {

using Move = std::pair<OpIndex, plan::Direction>;

// The plan's last migration of a tensor issued by operator `op` (its issue point, its
// direction), from its migrations by issue point; before the first of them, the step's last one:
// a tensor is where the step before left it. Null for a tensor the plan does not move.
const Move* last_move(const std::vector<Move>& list, OpIndex op) {
  if (list.empty()) return nullptr;
  const auto after = std::upper_bound(list.begin(), list.end(), op,
                                      [](OpIndex k, const Move& move) { return k < move.first; });
  return after == list.begin() ? &list.back() : &*(after - 1);
}

}  // namespace

bool Executor::State::plan_has_away(TensorId id, OpIndex op) const {
  const auto found = moves.find(id);
  if (found == moves.end()) return false;
  const Move* last = last_move(found->second, op);
  return last != nullptr && last->second == plan::Direction::kOffload;
}

namespace {

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

std::string Executor::State::against_plan(OpIndex op) const {
  Share away;
  Share unknown;
  for (const auto& [id, e] : entries) {
    if (!holds_device_memory(e.location) || e.bytes == 0) continue;
    if (plan_has_away(id, op)) {
      away.add(id, e.bytes);
    } else if (next_uses.first(id) == NextUses::kNever) {
      unknown.add(id, e.bytes);
    }
  }
  // make_room has just forgotten the freed ones among these: the rest the program still holds.
  Share late;
  for (const TensorId id : released) {
    const auto found = entries.find(id);
    if (found != entries.end() && holds_device_memory(found->second.location))
      late.add(id, found->second.bytes);
  }
  if (away.tensors + unknown.tensors + late.tensors == 0)
    return "; against the plan: nothing on the device beyond it";
  std::string text =
      cat("; against the plan: ", away.bytes, " bytes in ", away.tensors, " tensors the plan has away here");
  if (away.tensors > 0) {
    const Entry& e = entries.at(away.largest);
    const Move* left = last_move(moves.at(away.largest), op);
    text +=
        cat(" (largest: tensor ", away.largest, ", ", away.largest_bytes, " bytes, ", to_string(e.location),
            ", sent out before operator ", left->first, left->first > op ? " of the step before" : "", ")");
  }
  text += cat(", ", late.bytes, " bytes in ", late.tensors, " past their profiled release");
  if (late.tensors > 0) text += cat(" (largest: tensor ", late.largest, ")");
  text += cat(", ", unknown.bytes, " bytes in ", unknown.tensors, " the profile does not know");
  if (unknown.tensors > 0) text += cat(" (largest: tensor ", unknown.largest, ")");
  return text;
}

}  // namespace teraio::runtime
