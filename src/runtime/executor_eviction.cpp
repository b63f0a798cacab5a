// runtime/executor_eviction: what the executor moves and when (see executor_state.hpp).
#include <algorithm>

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

bool Executor::State::free_down_to(OpIndex op, std::span<const TensorId> keep, std::uint64_t incoming,
                                   std::uint64_t limit, std::uint64_t fetching, bool evict) {
  while (true) {
    // A fetch that gets a spare block turns spare bytes into resident ones: it adds nothing.
    const std::uint64_t adds =
        fetching != 0 && memory.has_spare(fetching) ? incoming - std::min(incoming, fetching) : incoming;
    const std::uint64_t spare = memory.spare_bytes();
    if (resident + spare + adds <= limit) return true;
    const std::uint64_t short_by = resident + spare + adds - limit;
    // Giving a spare block back moves nothing. An eviction below keeps its block in turn (if
    // the memory keeps blocks), and the next round gives that back unless the fetch takes it.
    if (spare > 0 && memory.give_back_spares(short_by, fetching) > 0) continue;
    auto offloading = std::find_if(in_flight.begin(), in_flight.end(), [&](TensorId id) {
      return entries.at(id).location == Location::kOffloading && !contains_id(keep, id);
    });
    if (offloading != in_flight.end()) {
      complete(*offloading, entries.at(*offloading), op);
      continue;
    }
    if (!evict) return false;
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
    // Whether the program's late frees account for this one (before the victim leaves the count).
    const bool late = follows_plan() && late_bytes(op) >= short_by;
    Entry& e = entries.at(id);
    if (!start_offload(id, e, io::TierKind::kHost, nullptr)) {
      if (wait_for_tier_room(op)) continue;
      throw Error(ErrorKind::kTierFull,
                  over_budget(op, incoming,
                              cat("neither the host nor the SSD tier has room for tensor ", id, " (", e.bytes,
                                  " bytes)")));
    }
    ++stats.evictions;
    if (late) ++stats.late_free_evictions;
    if (log::enabled(log::Level::kDebug)) {
      log::debug("evict tensor ", id, " (", e.bytes, " bytes) at operator ", op, ": ", resident,
                 " resident + ", incoming, " incoming over ", limit,
                 follows_plan() ? against_plan(op) : std::string{});
    }
    if (e.location == Location::kOffloading) complete(id, e, op);  // else dropped: nothing to copy
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
