#include "teraio/plan/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "input_checks.hpp"
#include "simulator_channels.hpp"
#include "simulator_index.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

using trace::OpIndex;

using detail::Busy;
using detail::Channels;
using detail::kNever;
using detail::Request;
constexpr std::uint32_t kDemandFetch = detail::kNoMigration;

enum class State : std::uint8_t { kAbsent, kResident, kOffloading, kOffloaded, kPrefetching };

class Engine {
 public:
  Engine(const trace::Trace& t, const Plan& plan, const Hardware& hw, const SimulationOptions& opts)
      : trace_(t),
        plan_(plan),
        hw_(hw),
        opts_(opts),
        n_(t.ops.size()),
        index_(detail::index_replay(t, plan)),
        channels_(hw) {}

  SimulationResult run() {
    result_.steps = std::max<std::size_t>(opts_.steps, 1);
    result_.budget = hw_.gpu_budget;
    for (const auto& op : trace_.ops) result_.ideal_step_time_s += op.duration_s;
    initial_state();
    for (step_ = 0; step_ < result_.steps; ++step_) {
      reported_ = step_ + 1 == result_.steps;
      if (reported_) begin_reported_step();
      for (std::size_t k = 0; k < n_; ++k) run_op(static_cast<OpIndex>(k));
    }
    finish_report();
    return std::move(result_);
  }

 private:
  // --- setup ---------------------------------------------------------------------------------

  // Persistent tensors whose last migration in a step is an offload are out at the step
  // boundary in the steady state; everything else starts on the device.
  void initial_state() {
    state_.assign(trace_.tensors.size(), State::kAbsent);
    evicted_.assign(trace_.tensors.size(), false);
    kept_.assign(trace_.tensors.size(), false);
    in_use_.assign(trace_.tensors.size(), 0);
    tier_of_.assign(trace_.tensors.size(), Tier::kHost);
    request_of_.assign(trace_.tensors.size(), std::numeric_limits<std::uint32_t>::max());
    std::vector<std::int64_t> last(trace_.tensors.size(), -1);
    for (std::size_t m = 0; m < plan_.migrations.size(); ++m) {
      const std::uint32_t ti = index_.migration_tensor[m];
      if (last[ti] < 0 ||
          plan_.migrations[m].issue_before >= plan_.migrations[std::size_t(last[ti])].issue_before)
        last[ti] = static_cast<std::int64_t>(m);
    }
    memory_ = trace_.untracked_bytes;
    for (std::size_t i = 0; i < trace_.tensors.size(); ++i) {
      const auto& t = trace_.tensors[i];
      if (!t.persistent) continue;
      if (last[i] >= 0 && plan_.migrations[std::size_t(last[i])].direction == Direction::kOffload) {
        state_[i] = State::kOffloaded;
        tier_of_[i] = plan_.migrations[std::size_t(last[i])].tier;
        tier_used_[tier_index(tier_of_[i])] += t.bytes;
      } else {
        state_[i] = State::kResident;
        memory_ += t.bytes;
        if (last[i] >= 0 && plan_.migrations[std::size_t(last[i])].kept_copy) {
          // Back at the step boundary with its copy still in the tier.
          const Tier tier = plan_.migrations[std::size_t(last[i])].tier;
          kept_[i] = true;
          tier_of_[i] = tier;
          tier_used_[tier_index(tier)] += t.bytes;
        }
      }
    }
  }

  void begin_reported_step() {
    step_start_ = now_;
    result_.stall_per_op.assign(n_, 0.0);
    result_.memory_at_op.assign(n_, 0);
    result_.peak_memory = memory_;
    result_.host_peak = tier_used_[0];
    result_.ssd_peak = tier_used_[1];
    if (opts_.record_timeline) result_.timeline.memory.emplace_back(0.0, memory_);
  }

  // --- channels --------------------------------------------------------------------------------

  bool advance(double until) { return channels_.advance(until); }

  // Applies, in time order, every completion at or before `until`.
  void complete_until(double until) {
    for (std::uint32_t id = channels_.pop_completed(until); id != Channels::kNoRequest;
         id = channels_.pop_completed(until)) {
      const Request& r = channels_.request(id);
      const std::uint64_t bytes = trace_.tensors[r.tensor].bytes;
      if (r.offload) {
        if (r.cancelled) continue;
        state_[r.tensor] = State::kOffloaded;
        set_memory(memory_ - bytes, r.end);
      } else {
        state_[r.tensor] = State::kResident;
        // A prefetch that keeps the copy leaves it in the tier for a later drop.
        if (r.migration != kDemandFetch && plan_.migrations[r.migration].kept_copy)
          kept_[r.tensor] = true;
        else
          tier_used_[tier_index(r.tier)] -= bytes;
      }
      request_of_[r.tensor] = std::numeric_limits<std::uint32_t>::max();
    }
  }

  // Blocks the compute stream until request `id` is complete. Time advances in steps that
  // cannot pass the request's completion (the earliest it could finish if served at once), so
  // no other transfer is committed beyond the moment the compute stream resumes.
  void wait_for(std::uint32_t id) {
    while (channels_.request(id).end == kNever) {
      // A stretched slice (the shared PCIe rate) ends after the bound, which closes in on its
      // end geometrically: once the rest is below what a double resolves, step just past it
      // rather than commit the next slice to its end (urgent work could no longer cut it).
      const double bound = channels_.completion_bound(id);
      if (!advance(bound) && !advance(std::nextafter(bound, kNever)) && !channels_.schedule_one())
        throw_internal("simulator: a request can never be scheduled");
    }
    now_ = std::max(now_, channels_.request(id).end);
    advance(now_);
    complete_until(now_);
  }

  std::uint32_t submit(std::uint32_t migration, std::uint32_t tensor, bool offload, Tier tier, bool urgent,
                       std::uint64_t deadline) {
    Request r;
    r.migration = migration;
    r.tensor = tensor;
    r.bytes = trace_.tensors[tensor].bytes;
    r.offload = offload;
    r.tier = tier;
    r.urgent = urgent;
    r.deadline = deadline;
    const std::uint32_t id = channels_.submit(r, now_);
    request_of_[tensor] = id;
    if (deadline != std::numeric_limits<std::uint64_t>::max()) deadlines_.push({deadline, id});
    if (reported_) result_.tier_bytes[tier_index(tier)][offload ? 0 : 1] += r.bytes;
    return id;
  }

  // --- state -----------------------------------------------------------------------------------

  static std::size_t tier_index(Tier t) { return t == Tier::kHost ? 0 : 1; }

  void set_memory(std::uint64_t bytes, double at) {
    memory_ = bytes;
    if (!reported_) return;
    result_.peak_memory = std::max(result_.peak_memory, memory_);
    if (opts_.record_timeline) result_.timeline.memory.emplace_back(at - step_start_, memory_);
  }

  void violation(ViolationKind kind, OpIndex op, trace::TensorId tensor, std::uint64_t bytes,
                 std::string message) {
    ++result_.violation_counts[static_cast<std::size_t>(kind)];
    if (result_.violations.size() < opts_.max_violations)
      result_.violations.push_back({kind, step_, op, tensor, bytes, std::move(message)});
  }

  void check_tier(Tier tier, OpIndex op, trace::TensorId tensor) {
    const std::size_t i = tier_index(tier);
    const std::uint64_t cap = tier == Tier::kHost ? hw_.host_capacity : hw_.ssd_capacity;
    if (reported_) {
      result_.host_peak = std::max(result_.host_peak, tier_used_[0]);
      result_.ssd_peak = std::max(result_.ssd_peak, tier_used_[1]);
    }
    if (tier_used_[i] > cap)
      violation(tier == Tier::kHost ? ViolationKind::kHostOverCap : ViolationKind::kSsdOverCap, op, tensor,
                tier_used_[i] - cap,
                cat(to_string(tier), " tier holds ", format_bytes(tier_used_[i]), " > capacity ",
                    format_bytes(cap)));
  }

  void skipped() {
    if (reported_) ++result_.skipped_migrations;
  }

  void issue(std::uint32_t m, OpIndex k) {
    const Migration& mig = plan_.migrations[m];
    const std::uint32_t ti = index_.migration_tensor[m];
    const auto& t = trace_.tensors[ti];
    const std::uint64_t base = step_ * n_;
    const std::uint64_t deadline = base + mig.deadline + (mig.deadline < mig.issue_before ? n_ : 0);
    if (mig.direction == Direction::kOffload) {
      if (state_[ti] != State::kResident) {
        // In the first step the steady-state start makes some migrations moot; later ones are plan errors.
        if ((step_ == 0 || evicted_[ti]) && state_[ti] == State::kOffloaded) return skipped();
        return violation(ViolationKind::kInconsistent, k, t.id, t.bytes,
                         cat("offload of tensor ", t.id, " (", t.name, ") issued before operator ", k,
                             " while it is not resident"));
      }
      if (kept_[ti]) return drop(ti);  // kept_copy or not: nothing needs copying
      state_[ti] = State::kOffloading;
      tier_of_[ti] = mig.tier;
      tier_used_[tier_index(mig.tier)] += t.bytes;
      check_tier(mig.tier, k, t.id);
      offloads_in_flight_.push_back(submit(m, ti, true, mig.tier, mig.urgent, deadline));
      return;
    }
    switch (state_[ti]) {
      case State::kOffloaded:
        make_room(k, t.bytes);
        state_[ti] = State::kPrefetching;
        evicted_[ti] = false;
        set_memory(memory_ + t.bytes, now_);
        submit(m, ti, false, tier_of_[ti], mig.urgent, deadline);
        return;
      case State::kOffloading: {
        // The offload has not finished: the data never left, so keep it and drop both.
        Request& r = channels_.request(request_of_[ti]);
        r.cancelled = true;
        tier_used_[tier_index(r.tier)] -= t.bytes;
        state_[ti] = State::kResident;
        return skipped();
      }
      case State::kResident: return skipped();
      case State::kAbsent:
      case State::kPrefetching:
        return violation(ViolationKind::kInconsistent, k, t.id, t.bytes,
                         cat("prefetch of tensor ", t.id, " (", t.name, ") issued before operator ", k,
                             " while it is not offloaded"));
    }
  }

  // A resident tensor whose tier kept an unchanged copy leaves at once: the copy becomes where
  // its bytes are, and nothing crosses the link.
  void drop(std::uint32_t ti) {
    const std::uint64_t bytes = trace_.tensors[ti].bytes;
    kept_[ti] = false;
    state_[ti] = State::kOffloaded;
    set_memory(memory_ - bytes, now_);
    if (reported_) {
      ++result_.dropped;
      result_.dropped_bytes += bytes;
    }
  }

  // Operator k changes what tensor `ti` holds: a copy kept in its tier is stale and goes.
  void written(std::uint32_t ti) {
    if (!kept_[ti]) return;
    kept_[ti] = false;
    tier_used_[tier_index(tier_of_[ti])] -= trace_.tensors[ti].bytes;
  }

  // Makes sure tensor `ti` is on the device for operator k (global g), fetching on demand.
  void make_resident(std::uint32_t ti, OpIndex k, std::uint64_t g) {
    const auto& t = trace_.tensors[ti];
    switch (state_[ti]) {
      case State::kResident:
      case State::kAbsent: return;
      case State::kOffloading: {
        channels_.request(request_of_[ti]).cancelled = true;
        tier_used_[tier_index(tier_of_[ti])] -= t.bytes;
        state_[ti] = State::kResident;
        return violation(
            ViolationKind::kInconsistent, k, t.id, t.bytes,
            cat("operator ", k, " uses tensor ", t.id, " (", t.name, ") while it is being offloaded"));
      }
      case State::kPrefetching: {
        const std::uint32_t id = request_of_[ti];
        violation(ViolationKind::kNotResident, k, t.id, t.bytes,
                  cat("operator ", k, " uses tensor ", t.id, " (", t.name, ") before its prefetch deadline"));
        return wait_for(id);
      }
      case State::kOffloaded: {
        // A tensor the reactive mode evicted comes back on demand by design; one the plan left out is the
        // plan's fault.
        if (!evicted_[ti])
          violation(ViolationKind::kNotResident, k, t.id, t.bytes,
                    cat("operator ", k, " uses tensor ", t.id, " (", t.name,
                        ") that is not resident: demand fetch"));
        evicted_[ti] = false;
        make_room(k, t.bytes);
        state_[ti] = State::kPrefetching;
        set_memory(memory_ + t.bytes, now_);
        if (reported_) {
          ++result_.demand_fetches;
          result_.demand_fetch_bytes += t.bytes;
        }
        const std::uint32_t id = submit(kDemandFetch, ti, false, tier_of_[ti], true, g);
        return wait_for(id);
      }
    }
  }

  void wait_deadlines(std::uint64_t g, bool offloads) {
    std::vector<std::pair<std::uint64_t, std::uint32_t>> later;
    while (!deadlines_.empty() && deadlines_.top().first <= g) {
      const auto entry = deadlines_.top();
      deadlines_.pop();
      const Request& r = channels_.request(entry.second);
      if (r.offload != offloads) {
        later.push_back(entry);
        continue;
      }
      if (!r.cancelled) wait_for(entry.second);
    }
    for (const auto& e : later) deadlines_.push(e);
  }

  // Next use of tensor `ti` after operator k, in operators from the start of this step
  // (persistent tensors wrap into the next step).
  std::uint64_t next_use(std::uint32_t ti, OpIndex k) const {
    const auto& uses = trace_.tensors[ti].uses;
    const auto it = std::upper_bound(uses.begin(), uses.end(), k);
    if (it != uses.end()) return *it;
    return trace_.tensors[ti].persistent ? n_ + uses.front() : std::numeric_limits<std::uint64_t>::max();
  }

  // Reactive mode: before `bytes` are allocated for operator k, bring memory down so that
  // they fit. Tensors operator k uses are never chosen.
  void make_room(OpIndex k, std::uint64_t incoming) {
    if (!opts_.enforce_budget || memory_ + incoming <= hw_.gpu_budget) return;
    const std::uint64_t g = step_ * n_ + k;
    const std::uint64_t target = incoming >= hw_.gpu_budget ? 0 : hw_.gpu_budget - incoming;
    // First the offloads already under way, soonest deadline first.
    while (memory_ > target) {
      std::erase_if(offloads_in_flight_, [&](std::uint32_t id) {
        return channels_.request(id).end <= now_ || channels_.request(id).cancelled ||
               state_[channels_.request(id).tensor] != State::kOffloading;
      });
      if (offloads_in_flight_.empty()) break;
      const auto soonest = std::min_element(
          offloads_in_flight_.begin(), offloads_in_flight_.end(), [&](std::uint32_t a, std::uint32_t b) {
            return channels_.request(a).deadline < channels_.request(b).deadline;
          });
      wait_for(*soonest);
    }
    if (memory_ <= target) return;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> victims;
    for (std::uint32_t ti = 0; ti < trace_.tensors.size(); ++ti)
      if (state_[ti] == State::kResident && in_use_[ti] != g + 1) victims.emplace_back(next_use(ti, k), ti);
    std::sort(victims.begin(), victims.end(), std::greater<>());
    for (const auto& [next, ti] : victims) {
      if (memory_ <= target) break;
      const std::uint64_t bytes = trace_.tensors[ti].bytes;
      if (kept_[ti]) {
        evicted_[ti] = true;
        drop(ti);
        continue;
      }
      Tier tier = Tier::kHost;
      if (!tier_takes(Tier::kHost, bytes)) {
        if (!tier_takes(Tier::kSsd, bytes)) continue;
        tier = Tier::kSsd;
      }
      state_[ti] = State::kOffloading;
      tier_of_[ti] = tier;
      evicted_[ti] = true;
      tier_used_[tier_index(tier)] += bytes;
      if (reported_) {
        ++result_.evictions;
        result_.eviction_bytes += bytes;
      }
      wait_for(submit(kDemandFetch, ti, true, tier, true, g));
    }
  }

  // Whether an eviction of `bytes` can go to `tier`: room there, and bandwidth out and back.
  bool tier_takes(Tier tier, std::uint64_t bytes) const {
    const std::uint64_t cap = tier == Tier::kHost ? hw_.host_capacity : hw_.ssd_capacity;
    return tier_used_[tier_index(tier)] + bytes <= cap && detail::route_bandwidth(hw_, tier, true) > 0 &&
           detail::route_bandwidth(hw_, tier, false) > 0;
  }

  void check_budget(OpIndex k) {
    if (memory_ > hw_.gpu_budget)
      violation(ViolationKind::kOverBudget, k, 0, memory_ - hw_.gpu_budget,
                cat("device memory ", format_bytes(memory_), " > budget ", format_bytes(hw_.gpu_budget),
                    " before operator ", k, " (", trace_.ops[k].name, ")"));
  }

  void run_op(OpIndex k) {
    const std::uint64_t g = step_ * n_ + k;
    if (opts_.enforce_budget)
      for (const std::uint32_t ti : index_.used.at(k)) in_use_[ti] = g + 1;
    const double ready = now_;
    advance(now_);
    complete_until(now_);
    // Memory for this operator's prefetches can only be allocated once the offloads due here are out.
    wait_deadlines(g, true);
    for (const std::uint32_t m : index_.issued.at(k)) issue(m, k);
    wait_deadlines(g, false);
    for (const std::uint32_t ti : index_.used.at(k)) {
      make_resident(ti, k, g);
      if (!trace::only_reads(trace_.tensors[ti], k)) written(ti);
    }
    for (const std::uint32_t ti : index_.first_use.at(k)) {
      make_room(k, trace_.tensors[ti].bytes);
      state_[ti] = State::kResident;
      set_memory(memory_ + trace_.tensors[ti].bytes, now_);
    }
    check_budget(k);
    const double start = now_;
    now_ += trace_.ops[k].duration_s;
    if (reported_) {
      result_.stall_per_op[k] = start - ready;
      result_.memory_at_op[k] = memory_;
      if (opts_.record_timeline) result_.timeline.ops.push_back({start - step_start_, now_ - step_start_, k});
    }
    advance(now_);
    complete_until(now_);
    for (const std::uint32_t ti : index_.released.at(k)) {
      const std::uint64_t bytes = trace_.tensors[ti].bytes;
      // Moved out in the period that ends in its release: its tier copy goes with it. An
      // offload still running keeps its channel time but no longer affects memory.
      if (state_[ti] == State::kOffloading) channels_.request(request_of_[ti]).cancelled = true;
      if (state_[ti] == State::kResident || state_[ti] == State::kOffloading)
        set_memory(memory_ - bytes, now_);
      if (state_[ti] == State::kOffloaded || state_[ti] == State::kOffloading)
        tier_used_[tier_index(tier_of_[ti])] -= bytes;
      written(ti);  // a kept copy goes with the tensor
      state_[ti] = State::kAbsent;
    }
  }

  void finish_report() {
    const double step_end = now_;
    result_.step_time_s = step_end - step_start_;
    // The first operator that starts with the most memory: ties go to the earliest, as in
    // the synthetic trace's summary, so both name the same operator.
    const auto peak = std::max_element(result_.memory_at_op.begin(), result_.memory_at_op.end());
    result_.peak_op =
        peak == result_.memory_at_op.end() ? 0 : static_cast<OpIndex>(peak - result_.memory_at_op.begin());
    for (const double s : result_.stall_per_op) result_.stall_s += s;
    result_.share_of_ideal = result_.step_time_s > 0 ? result_.ideal_step_time_s / result_.step_time_s : 1.0;
    std::vector<OpStall> stalls;
    for (std::size_t k = 0; k < result_.stall_per_op.size(); ++k)
      if (result_.stall_per_op[k] > 0) stalls.push_back({static_cast<OpIndex>(k), result_.stall_per_op[k]});
    std::sort(stalls.begin(), stalls.end(), [](const OpStall& a, const OpStall& b) {
      return a.stall_s != b.stall_s ? a.stall_s > b.stall_s : a.op < b.op;
    });
    if (stalls.size() > opts_.top_stalls) stalls.resize(opts_.top_stalls);
    result_.top_stalls = std::move(stalls);
    std::array<double, kChannelCount> bytes{};
    for (std::size_t c = 0; c < kChannelCount; ++c) {
      ChannelReport& rep = result_.channels[c];
      for (const Busy& b : channels_.busy(c)) {
        const double s = std::max(b.start, step_start_);
        const double e = std::min(b.end, step_end);
        if (e <= s) continue;
        rep.busy_s += e - s;
        if (b.start >= step_start_) {
          bytes[c] += b.bytes;
          if (b.first) ++rep.requests;
        }
        if (opts_.record_timeline)
          result_.timeline.transfers[c].push_back({b.start - step_start_, b.end - step_start_, b.migration});
      }
      rep.utilization = result_.step_time_s > 0 ? rep.busy_s / result_.step_time_s : 0;
      rep.bytes = static_cast<std::uint64_t>(std::llround(bytes[c]));
    }
  }

  const trace::Trace& trace_;
  const Plan& plan_;
  const Hardware& hw_;
  const SimulationOptions& opts_;
  const std::size_t n_;

  const detail::ReplayIndex index_;

  std::vector<State> state_;
  std::vector<bool> evicted_;          // moved out by enforce_budget, not by the plan
  std::vector<bool> kept_;             // resident, and its tier (tier_of_) holds an unchanged copy
  std::vector<std::uint64_t> in_use_;  // stamp: used by the operator being prepared
  std::vector<std::uint32_t> offloads_in_flight_;
  std::vector<Tier> tier_of_;
  std::vector<std::uint32_t> request_of_;
  Channels channels_;
  std::priority_queue<std::pair<std::uint64_t, std::uint32_t>,
                      std::vector<std::pair<std::uint64_t, std::uint32_t>>, std::greater<>>
      deadlines_;

  std::size_t step_ = 0;
  bool reported_ = false;
  double now_ = 0, step_start_ = 0;
  std::uint64_t memory_ = 0;
  std::array<std::uint64_t, 2> tier_used_{};
  SimulationResult result_;
};

}  // namespace

SimulationResult simulate(const trace::Trace& trace, const Plan& plan, const Hardware& hardware,
                          const SimulationOptions& options) {
  detail::require_plannable(trace, "simulate");
  if (trace.step_begins.size() > 1) return simulate(trace::extract_step(trace, 0), plan, hardware, options);
  if (!std::isfinite(hardware.request_latency_s) || hardware.request_latency_s < 0)
    throw Error(ErrorKind::kInvalidArgument,
                cat("simulate: request latency ", hardware.request_latency_s, " is not a finite time >= 0"));
  if (!std::isfinite(hardware.pcie_duplex_bandwidth) || hardware.pcie_duplex_bandwidth < 0)
    throw Error(ErrorKind::kInvalidArgument,
                cat("simulate: PCIe bandwidth both ways at once ", hardware.pcie_duplex_bandwidth,
                    " is not a finite rate >= 0"));
  // Only the routes the plan uses need bandwidth: the planner accepts a switched-off channel
  // (bandwidth 0) and plans around it, so its plans must replay.
  for (std::size_t m = 0; m < plan.migrations.size(); ++m) {
    const Migration& mig = plan.migrations[m];
    const bool offload = mig.direction == Direction::kOffload;
    const double rate = detail::route_bandwidth(hardware, mig.tier, offload);
    if (!(rate > 0))
      throw Error(
          ErrorKind::kInvalidArgument,
          cat("simulate: plan migration ", m, " (", to_string(mig.direction), " of tensor ", mig.tensor, ", ",
              to_string(mig.tier), " tier) needs a channel with no bandwidth (", hardware.describe(), ")"));
  }
  return Engine(trace, plan, hardware, options).run();
}

}  // namespace teraio::plan
