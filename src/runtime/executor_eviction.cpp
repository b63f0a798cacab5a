// runtime/executor_eviction: what the executor moves and when (see executor_state.hpp).
#include <algorithm>
#include <unordered_set>

#include "executor_state.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::runtime {

using namespace executor_detail;

std::string Executor::State::over_budget(OpIndex op, std::uint64_t incoming, std::string_view why) const {
  return cat("tracked tensors hold ", resident, " bytes",
             incoming > 0 ? cat(" (+", incoming, " to fetch)") : "", ", over the device budget of ",
             config.budget, " bytes, at operator ", op, ": ", why);
}

void Executor::State::make_room(OpIndex op, std::span<const TensorId> keep, std::uint64_t incoming,
                                std::uint64_t fetching) {
  if (mode == Mode::kPassive || config.budget == 0) return;
  if (resident + memory.spare_bytes() + incoming > config.budget) {
    // A step that follows its profile frees what the profile saw freed: looking at those few
    // suffices (W3 at its budget's edge: ~1400 scans of every tracked tensor, 1.2 s per step).
    // A tensor freed otherwise is forgotten when picked for eviction (free_down_to).
    if (follows_plan()) {
      forget_released(keep);
    } else {
      forget_freed(keep);
    }
  }
  free_down_to(op, keep, incoming, config.budget, fetching);
}

std::optional<TensorId> Executor::State::pick_victim(OpIndex op, std::span<const TensorId> keep) const {
  const bool by_next_use = follows_plan();
  std::optional<TensorId> best;
  std::uint64_t best_next = 0;
  for (const auto& [last_use, id] : idle) {
    if (contains_id(keep, id)) continue;
    if (!by_next_use) return id;
    const std::uint64_t next = next_uses.after(id, op);
    if (!best || next > best_next) {
      best = id;
      best_next = next;
      if (next == NextUses::kNever) break;  // nothing comes later
    }
  }
  return best;
}

void Executor::State::free_down_to(OpIndex op, std::span<const TensorId> keep, std::uint64_t incoming,
                                   std::uint64_t limit, std::uint64_t fetching) {
  while (true) {
    // A fetch that gets a spare block turns spare bytes into resident ones: it adds nothing.
    const std::uint64_t adds =
        fetching != 0 && memory.has_spare(fetching) ? incoming - std::min(incoming, fetching) : incoming;
    const std::uint64_t spare = memory.spare_bytes();
    if (resident + spare + adds <= limit) return;
    // Giving a spare block back moves nothing. An eviction below keeps its block in turn (if
    // the memory keeps blocks), and the next round gives that back unless the fetch takes it.
    if (spare > 0 && memory.give_back_spares(resident + spare + adds - limit, fetching) > 0) continue;
    auto offloading = std::find_if(in_flight.begin(), in_flight.end(), [&](TensorId id) {
      return entries.at(id).location == Location::kOffloading && !contains_id(keep, id);
    });
    if (offloading != in_flight.end()) {
      complete(*offloading, entries.at(*offloading), op);
      continue;
    }
    const std::optional<TensorId> victim = pick_victim(op, keep);
    if (!victim) {
      throw Error(ErrorKind::kInfeasible, over_budget(op, incoming, "no idle resident tensor left to evict"));
    }
    const TensorId id = *victim;
    if (!memory.alive(id)) {
      // Freed but not yet forgotten (make_room did not look at every tensor): nothing to copy.
      forget(entries.find(id));
      continue;
    }
    Entry& e = entries.at(id);
    if (!start_offload(id, e, io::TierKind::kHost, nullptr)) {
      if (wait_for_tier_room(op)) continue;
      throw Error(ErrorKind::kTierFull,
                  over_budget(op, incoming,
                              cat("neither the host nor the SSD tier has room for tensor ", id, " (", e.bytes,
                                  " bytes)")));
    }
    ++stats.evictions;
    log::debug("evict tensor ", id, " (", e.bytes, " bytes) at operator ", op, ": ", resident, " resident + ",
               incoming, " incoming over ", limit);
    if (e.location == Location::kOffloading) complete(id, e, op);  // else dropped: nothing to copy
  }
}

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
  std::uint64_t plan_start = 0;  // what the plan holds on the device at every step's start
  for (const auto& [id, e] : entries) {
    if (!next_uses.persistent(id) || away.contains(id)) continue;
    plan_start += e.bytes;
    if ((e.location != Location::kHost && e.location != Location::kSsd) || e.bytes == 0) continue;
    // One the plan sends out before its first use (used last at the step's end) would go straight
    // back: the plan's own prefetch brings it.
    const std::uint64_t first = next_uses.first(id);
    if (const auto leaves = leaves_first.find(id); leaves != leaves_first.end() && leaves->second <= first)
      continue;
    back.emplace_back(first, id);
  }
  // A plan that starts over the budget (a plan_filter's, or one that leaves the shortfall to
  // reactive eviction from the first operator) cannot be followed from its start: filling the
  // budget with its tensors would leave the first operators' outputs no room but evictions.
  if (config.budget != 0 && plan_start > config.budget) back.clear();
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
  // Whether it can fit at all once every offload under way is done and spare blocks are given
  // back: if not, nothing is waited for.
  std::uint64_t leaving = 0;
  for (const TensorId id : in_flight) {
    const Entry& e = entries.at(id);
    if (e.location == Location::kOffloading) leaving += e.bytes;
  }
  if (resident - std::min(resident, leaving) + bytes > config.budget) return false;
  while (true) {
    // As free_down_to: a fetch that gets a spare block of its size adds nothing.
    const std::uint64_t adds = memory.has_spare(bytes) ? 0 : bytes;
    const std::uint64_t spare = memory.spare_bytes();
    if (resident + spare + adds <= config.budget) return true;
    if (spare > 0 && memory.give_back_spares(resident + spare + adds - config.budget, bytes) > 0) continue;
    auto offloading = std::find_if(in_flight.begin(), in_flight.end(), [&](TensorId id) {
      return entries.at(id).location == Location::kOffloading;
    });
    if (offloading == in_flight.end()) return false;
    complete(*offloading, entries.at(*offloading), current_op);
  }
}

bool Executor::State::wait_for_tier_room(OpIndex op) {
  // A prefetch gives its extent back when its copy is done (a prefetch that keeps its copy
  // gives it up on the next try: start_offload), a taken-back offload when the copy out it
  // dropped is. The plan counted that space free from the copy's simulated end, but a link
  // slower than simulated finishes it later, so an eviction can find the tiers full while the
  // room is a copy away. Waiting for that copy stalls; failing would lose the step.
  struct Source {
    io::Transfer transfer;
    std::optional<std::size_t> settled;  // its index in `settling`, else a fetch in flight
    TensorId fetched = 0;
  };
  std::vector<Source> sources;
  for (std::size_t i = 0; i < settling.size(); ++i) {
    if (settling[i].release) sources.push_back({settling[i].transfer, i});  // else its extent stays taken
  }
  for (const TensorId id : in_flight) {
    const Entry& e = entries.at(id);
    if (e.location == Location::kFetching) sources.push_back({e.transfer, std::nullopt, id});
  }
  if (sources.empty()) return false;
  // Copies finish by urgency, not in the order issued (CUDA's copy lanes), so the wait is for
  // whichever is done first: each round blocks briefly on one source, then looks at all.
  const auto first_done = [&] {
    auto found = std::find_if(sources.begin(), sources.end(), [](Source& s) { return s.transfer.ready(); });
    return found == sources.end() ? nullptr : &*found;
  };
  const Source* done = first_done();
  if (done == nullptr) {
    const double start = now_s();
    for (std::size_t round = 0; (done = first_done()) == nullptr; ++round) {
      sources[round % sources.size()].transfer.wait_for(std::chrono::microseconds(200));
    }
    record_stall(op, start, now_s(), StallCause::kTierRoom);
  }
  if (done->settled) {
    if (std::exception_ptr failure = retire_settled(*done->settled, std::nullopt, op)) {
      std::rethrow_exception(failure);
    }
    return true;
  }
  Entry& e = entries.at(done->fetched);
  finish(done->fetched, e);
  // Fetched because an operator needs it soon: a least-recently-used pick must not send it
  // straight back out (a planned step picks by next use anyway).
  touch(done->fetched, e);
  return true;
}

void* Executor::State::reallocate_unless_refused(TensorId id) {
  try {
    return memory.reallocate(id);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::kOutOfMemory) throw;
    log::debug("fetch of tensor ", id, " refused by the allocator: ", error.what());
  }
  return nullptr;
}

void* Executor::State::allocate(TensorId id, Entry& e, std::span<const TensorId> keep) {
  if (void* fresh = reallocate_unless_refused(id)) return fresh;
  ++stats.allocation_retries;
  // Spare blocks go back first: the allocator may make the block of them, and nothing moves.
  if (memory.spare_bytes() > 0) {
    give_back_all_spares();
    if (void* fresh = reallocate_unless_refused(id)) return fresh;
  }
  std::vector<TensorId> stay(keep.begin(), keep.end());
  stay.push_back(id);
  forget_freed(stay);
  try {
    free_down_to(current_op, stay, 0, resident > e.bytes ? resident - e.bytes : 0);
  } catch (const Error& error) {
    // Nothing idle left to move: the retry below says whether what was freed suffices.
    if (!no_room(error)) throw;
  }
  memory.trim();
  return memory.reallocate(id);
}

void Executor::State::demand_fetch(TensorId id, Entry& e, OpIndex op, std::span<const TensorId> keep) {
  log::debug("demand fetch of tensor ", id, " (", e.bytes, " bytes) at operator ", op);
  make_room(op, keep, e.bytes, e.bytes);
  start_fetch(id, e, nullptr, keep);
  ++stats.demand_fetches;
  complete(id, e, op);
}

void Executor::State::make_resident(TensorId id, Entry& e, OpIndex op, std::span<const TensorId> keep) {
  switch (e.location) {
    case Location::kDevice: return;
    case Location::kOffloading: take_back(id, e, op); return;
    case Location::kFetching: complete(id, e, op); return;
    case Location::kHost:
    case Location::kSsd: demand_fetch(id, e, op, keep); return;
  }
}

void Executor::State::issue(const plan::Migration& migration, OpIndex op, std::span<const TensorId> used) {
  auto found = entries.find(migration.tensor);
  if (found == entries.end()) {
    ++stats.skipped;
    return;
  }
  if (!memory.alive(migration.tensor)) {
    forget(found);
    ++stats.skipped;
    return;
  }
  const TensorId id = found->first;
  Entry& e = found->second;
  if (migration.direction == plan::Direction::kOffload) {
    // A stale plan may offload a tensor this very operator uses: it would be taken back at once.
    if (e.location != Location::kDevice || contains_id(used, id) ||
        !start_offload(id, e, tier_kind(migration.tier), &migration)) {
      ++stats.skipped;
      return;
    }
    ++stats.planned_offloads;
    return;
  }
  if (e.location == Location::kOffloading) {
    take_back(id, e, op);
    return;
  }
  if (e.location != Location::kHost && e.location != Location::kSsd) {
    ++stats.skipped;
    return;
  }
  std::vector<TensorId> keep(used.begin(), used.end());
  keep.push_back(id);
  try {
    // An eviction for it may wait for tier room (wait_for_tier_room): skipping the prefetch
    // instead would leave its use a demand fetch, which needs the same room and the copy too.
    make_room(op, keep, e.bytes, e.bytes);
    start_fetch(id, e, &migration, keep);
  } catch (const Error& error) {
    // No room now (nothing left to move, or the allocator refused twice): the operators
    // before its use may free memory; if not, the use fetches it on demand.
    if (!no_room(error) && error.kind() != ErrorKind::kOutOfMemory) throw;
    log::debug("planned prefetch of tensor ", id, " skipped: ", error.what());
    ++stats.skipped;
    return;
  }
  ++stats.planned_prefetches;
}

}  // namespace teraio::runtime
