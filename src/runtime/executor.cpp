// runtime/executor: the public API over Executor::State (executor_state.hpp).
#include "teraio/runtime/executor.hpp"

#include <algorithm>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "executor_state.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::runtime {
namespace {

// Offloads before prefetches within each urgency: the memory they free comes back sooner.
bool issued_earlier(const plan::Migration& a, const plan::Migration& b) {
  if (a.urgent != b.urgent) return a.urgent;
  return a.direction == plan::Direction::kOffload && b.direction == plan::Direction::kPrefetch;
}

}  // namespace

std::string_view to_string(Location location) {
  switch (location) {
    case Location::kDevice: return "device";
    case Location::kOffloading: return "offloading";
    case Location::kHost: return "host";
    case Location::kSsd: return "ssd";
    case Location::kFetching: return "fetching";
  }
  return "unknown";
}

std::string_view to_string(StallCause cause) {
  switch (cause) {
    case StallCause::kTransfer: return "transfer";
    case StallCause::kOrdering: return "ordering";
    case StallCause::kTakeBack: return "take-back";
    case StallCause::kForget: return "forget";
    case StallCause::kDrain: return "drain";
    case StallCause::kTierRoom: return "tier-room";
  }
  return "unknown";
}

std::string_view to_string(BeforeOpPart part) {
  switch (part) {
    case BeforeOpPart::kRetire: return "retire";
    case BeforeOpPart::kIssue: return "issue";
    case BeforeOpPart::kResident: return "resident";
    case BeforeOpPart::kRoom: return "room";
  }
  return "unknown";
}

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::kPassive: return "passive";
    case Mode::kReactive: return "reactive";
    case Mode::kPlanned: return "planned";
  }
  return "unknown";
}

Executor::State::Call::~Call() {
  // Outside a step the program allocates outside the budget's care (the session fetches for
  // operators between steps too, and such a call may retire a copy out and keep its block).
  if (s_.in_step && s_.mode != Mode::kPassive && s_.config.budget != 0) return;
  s_.give_back_all_spares();
}

void Executor::State::give_back_all_spares() {
  try {
    memory.give_back_spares(std::numeric_limits<std::uint64_t>::max(), 0);
  } catch (const std::exception& error) {
    log::warn("runtime executor: cannot give back spare blocks: ", error.what());
  }
}

Executor::Executor(io::TierStore& store, TensorMemory& memory, ExecutorConfig config)
    : state_(std::make_unique<State>(store, memory, config)) {}

Executor::~Executor() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  try {
    s.drain();
  } catch (const std::exception& error) {
    log::warn("runtime executor: a transfer failed while shutting down: ", error.what());
  }
  for (auto& [id, e] : s.entries) {
    if (!e.extent) continue;
    try {
      s.store.release(*e.extent);
    } catch (const std::exception& error) {
      log::warn("runtime executor: cannot release the extent of tensor ", id, ": ", error.what());
    }
  }
}

void Executor::set_plan(const plan::Plan& plan) {
  std::vector<std::vector<plan::Migration>> index;
  for (const plan::Migration& m : plan.migrations) {
    if (m.issue_before >= index.size()) index.resize(std::size_t{m.issue_before} + 1);
    index[m.issue_before].push_back(m);
  }
  for (auto& bucket : index) std::stable_sort(bucket.begin(), bucket.end(), issued_earlier);
  // The first and last migration of each tensor by issue point; the last as the simulator picks
  // it (the later one of a tie).
  std::unordered_map<TensorId, std::pair<const plan::Migration*, const plan::Migration*>> ends;
  for (const plan::Migration& m : plan.migrations) {
    auto& [first, last] = ends[m.tensor];
    if (first == nullptr || m.issue_before < first->issue_before) first = &m;
    if (last == nullptr || m.issue_before >= last->issue_before) last = &m;
  }
  std::vector<plan::Migration> away;  // in the plan's order
  for (const plan::Migration& m : plan.migrations) {
    if (ends.at(m.tensor).second == &m && m.direction == plan::Direction::kOffload) away.push_back(m);
  }
  std::unordered_map<TensorId, OpIndex> leaves_first;
  std::unordered_map<TensorId, plan::Tier> kept_at_start;
  std::unordered_map<TensorId, std::vector<std::pair<OpIndex, plan::Direction>>> moves;
  for (const auto& bucket : index) {
    for (const plan::Migration& m : bucket) moves[m.tensor].emplace_back(m.issue_before, m.direction);
  }
  for (const auto& [id, first_last] : ends) {
    const auto& [first, last] = first_last;
    if (first->direction == plan::Direction::kOffload) leaves_first.emplace(id, first->issue_before);
    if (last->direction == plan::Direction::kPrefetch && last->kept_copy)
      kept_at_start.emplace(id, last->tier);
  }
  std::lock_guard lock(state_->mutex);
  state_->migrations_before = std::move(index);
  state_->away_at_start = std::move(away);
  state_->leaves_first = std::move(leaves_first);
  state_->kept_at_start = std::move(kept_at_start);
  state_->moves = std::move(moves);
}

void Executor::set_next_uses(NextUses next_uses) {
  std::lock_guard lock(state_->mutex);
  state_->next_uses = std::move(next_uses);
}

void Executor::set_mode(Mode mode) {
  std::lock_guard lock(state_->mutex);
  state_->mode = mode;
  state_->stats.mode = mode;
}

Mode Executor::mode() const {
  std::lock_guard lock(state_->mutex);
  return state_->mode;
}

std::uint64_t Executor::budget() const {
  return state_->config.budget;
}

void Executor::add_tensor(TensorId id, std::uint64_t bytes) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto [it, inserted] = s.entries.try_emplace(id);
  if (!inserted) throw Error(ErrorKind::kInvalidArgument, cat("tensor ", id, " is already tracked"));
  State::Entry& e = it->second;
  e.bytes = bytes;
  e.last_use = ++s.use_clock;
  e.location = Location::kHost;  // not yet counted: set_location adds it to the resident bytes
  s.set_location(id, e, Location::kDevice);
}

void Executor::remove_tensor(TensorId id) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto found = s.entries.find(id);
  if (found == s.entries.end()) return;
  s.forget(found);
}

bool Executor::contains(TensorId id) const {
  std::lock_guard lock(state_->mutex);
  return state_->entries.contains(id);
}

Location Executor::location(TensorId id) const {
  std::lock_guard lock(state_->mutex);
  return state_->entry(id).location;
}

bool Executor::in_flight(TensorId id) const {
  std::lock_guard lock(state_->mutex);
  const auto found = state_->entries.find(id);
  return found != state_->entries.end() && State::in_flight_location(found->second.location);
}

void Executor::written(std::span<const TensorId> ids) {
  std::lock_guard lock(state_->mutex);
  for (const TensorId id : ids) {
    const auto found = state_->entries.find(id);
    if (found != state_->entries.end()) state_->invalidate_copy(id, found->second);
  }
}

bool Executor::copy_kept(TensorId id) const {
  std::lock_guard lock(state_->mutex);
  const auto found = state_->entries.find(id);
  return found != state_->entries.end() && found->second.copy_kept;
}

std::uint64_t Executor::settled_changes() const {
  std::lock_guard lock(state_->mutex);
  return state_->settled_changes;
}

std::uint64_t Executor::resident_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->resident;
}

std::size_t Executor::tensor_count() const {
  std::lock_guard lock(state_->mutex);
  return state_->entries.size();
}

void Executor::begin_step() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.stats = StepStats{};
  s.released.clear();
  s.stats.step = s.steps_begun++;
  s.in_step = true;
  s.stats.mode = s.mode;
  s.stats.peak_resident = s.resident;
  s.current_op = 0;  // what is done before operator 0 (position_for_plan) is operator 0's
}

std::uint64_t Executor::position_for_plan() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (!s.in_step || s.mode != Mode::kPlanned) {
    throw Error(ErrorKind::kInvalidArgument, "position_for_plan: only at the start of a planned step");
  }
  const State::Call call(s);
  const std::uint64_t before = s.stats.positioned + s.stats.positioned_back;
  // Transfers the step before left finished count where they went, as at any operator.
  s.then_rethrow(s.retire_completed(), [&] { s.position_for_plan(); });
  return s.stats.positioned + s.stats.positioned_back - before;
}

void Executor::before_op(OpIndex k, std::span<const TensorId> used, std::uint64_t incoming_bytes) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const State::Call call(s);
  s.current_op = k;
  // Each phase's time goes to its part when the phase ends (a throw leaves it uncounted).
  double mark = s.now_s();
  const auto phase_done = [&](BeforeOpPart part) {
    const double now = s.now_s();
    s.stats.before_op_s[static_cast<std::size_t>(part)] += now - mark;
    mark = now;
  };
  std::exception_ptr retired = s.retire_completed();
  phase_done(BeforeOpPart::kRetire);
  s.then_rethrow(retired, [&] {
    if (s.mode == Mode::kPlanned && k < s.migrations_before.size()) {
      for (const plan::Migration& m : s.migrations_before[k]) s.issue(m, k, used);
    }
    phase_done(BeforeOpPart::kIssue);
    for (const TensorId id : used) {
      auto found = s.entries.find(id);
      if (found != s.entries.end()) s.make_resident(id, found->second, k, used);
    }
    for (const TensorId id : used) {
      auto found = s.entries.find(id);
      if (found != s.entries.end()) s.touch(id, found->second);
    }
    phase_done(BeforeOpPart::kResident);
    s.make_room(k, used, incoming_bytes);
    phase_done(BeforeOpPart::kRoom);
  });
}

void Executor::after_op(OpIndex k, std::span<const TensorId> used) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const State::Call call(s);
  if (s.follows_plan()) {
    const auto freed = s.next_uses.released_at(k);
    s.released.insert(s.released.end(), freed.begin(), freed.end());
  }
  struct Releasing {  // on every way out
    State& s;
    ~Releasing() { s.releasing_after.reset(); }
  } releasing{s};
  s.releasing_after = k;
  s.then_rethrow(s.retire_completed(), [&] { s.make_room(k, used, 0); });
}

StepStats Executor::end_step() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.in_step = false;
  s.give_back_all_spares();
  StepStats done = std::move(s.stats);
  s.stats = StepStats{};
  s.stats.step = s.steps_begun;
  s.stats.mode = s.mode;
  s.stats.peak_resident = s.resident;
  return done;
}

void Executor::fetch(std::span<const TensorId> ids) {
  fetch(ids, ids);
}

void Executor::fetch(std::span<const TensorId> ids, std::span<const TensorId> keep) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const State::Call call(s);
  std::vector<TensorId> kept(keep.begin(), keep.end());
  kept.insert(kept.end(), ids.begin(), ids.end());
  s.then_rethrow(s.retire_completed(), [&] {
    for (const TensorId id : ids) {
      auto found = s.entries.find(id);
      if (found == s.entries.end()) continue;
      s.make_resident(id, found->second, s.current_op, kept);
      s.touch(id, found->second);
    }
  });
}

void Executor::fetch_all() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const State::Call call(s);
  std::uint64_t total = 0;
  std::vector<TensorId> ids;
  ids.reserve(s.entries.size());
  for (const auto& [id, e] : s.entries) {
    total += e.bytes;
    ids.push_back(id);
  }
  if (s.config.budget != 0 && total > s.config.budget) {
    throw Error(ErrorKind::kInfeasible, cat("cannot make every tracked tensor resident: they hold ", total,
                                            " bytes, over the device budget of ", s.config.budget,
                                            " bytes by ", total - s.config.budget));
  }
  s.then_rethrow(s.retire_completed(), [&] {
    for (const TensorId id : ids) {
      // Making room for an earlier one may have forgotten it (the program freed it).
      const auto found = s.entries.find(id);
      if (found == s.entries.end()) continue;
      s.make_resident(id, found->second, s.current_op, ids);
      s.touch(id, found->second);
    }
  });
}

void Executor::drain_keeping_valid() {
  std::lock_guard lock(state_->mutex);
  const State::Call call(*state_);
  state_->drain(true);
}

void Executor::drain() {
  std::lock_guard lock(state_->mutex);
  const State::Call call(*state_);
  state_->drain();
}

double Executor::now_s() const {
  return state_->now_s();
}

}  // namespace teraio::runtime
