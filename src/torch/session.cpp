#include "session.hpp"

#include <c10/core/Device.h>

#include <algorithm>
#include <cmath>

#include "observer.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "tier_probe.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace teraio::torch_binding {
namespace {

c10::Device parse_device(const std::string& text) {
  try {
    c10::Device device(text);
    if (device.is_cuda() && !device.has_index()) device.set_index(0);
    if (!device.is_cpu() && !device.is_cuda()) throw Error(ErrorKind::kUnsupported, "");
    return device;
  } catch (const c10::Error&) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("unknown device '", text, "' (expected cpu, cuda or cuda:N)"));
  } catch (const Error&) {
    throw Error(ErrorKind::kUnsupported, cat("device '", text, "' is not supported (cpu or cuda)"));
  }
}

std::unique_ptr<io::DeviceCopier> make_copier(c10::Device device, io::CopyOrder order,
                                              std::size_t chunk_bytes) {
  if (device.is_cpu()) return io::make_host_copier();
#ifdef TERAIO_TORCH_CUDA
  return io::make_cuda_copier(device.index(), order, chunk_bytes);
#else
  static_cast<void>(order);
  static_cast<void>(chunk_bytes);
  throw Error(ErrorKind::kUnsupported, "this TeraIO build has no CUDA support (built against a CPU torch)");
#endif
}

// Numbers the sessions of the process, so that a plan kept from one is not run by another.
std::uint64_t next_session_serial() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace

std::string_view to_string(SessionPhase phase) {
  switch (phase) {
    case SessionPhase::kWarmup: return "warmup";
    case SessionPhase::kProfile: return "profile";
    case SessionPhase::kPlanned: return "planned";
    case SessionPhase::kPassive: return "passive";
    case SessionPhase::kClosed: return "closed";
  }
  return "?";
}

Session::Session(SessionConfig config)
    : tracks_writes_(config.keep_copies),
      config_(std::move(config)),
      device_(parse_device(config_.device)),
      serial_(next_session_serial()) {
  if (config_.warmup_steps < 0 || config_.profile_steps < 1) {
    throw Error(ErrorKind::kInvalidArgument, cat("warmup_steps must be >= 0 and profile_steps >= 1 (got ",
                                                 config_.warmup_steps, " and ", config_.profile_steps, ")"));
  }
  if (config_.retime_steps < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("retime_steps must be >= 0 (got ", config_.retime_steps, ")"));
  }
  plan::check_options(planner_options());  // at once, not at the first plan after the profile
  if (!config_.ssd_paths.empty() && config_.ssd_capacity == 0) {
    throw Error(ErrorKind::kInvalidArgument, "ssd paths given but ssd_capacity is 0");
  }
  for (const auto& [name, rate] :
       {std::pair{"d2h", config_.d2h_bandwidth}, std::pair{"h2d", config_.h2d_bandwidth},
        std::pair{"ssd_read", config_.ssd_read_bandwidth},
        std::pair{"ssd_write", config_.ssd_write_bandwidth},
        std::pair{"duplex", config_.pcie_duplex_bandwidth}}) {
    if (!std::isfinite(rate) || rate < 0)
      throw Error(ErrorKind::kInvalidArgument,
                  cat("bandwidths[\"", name, "\"] must be a finite number of bytes/s >= 0 (got ", rate, ")"));
  }
  if (const auto latency = config_.request_latency_s; latency && !(*latency >= 0 && *latency <= 1)) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("request_latency must be between 0 and 1 second (got ", *latency, ")"));
  }
  if (config_.hole_bytes > 0 && config_.hole_bytes >= config_.gpu_budget) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("hole_bytes (", format_bytes(config_.hole_bytes), ") must be below gpu_budget (",
                    config_.gpu_budget == 0 ? std::string("none") : format_bytes(config_.gpu_budget),
                    "): the hole counts in the budget"));
  }
  // The hole's bytes are the budget's too: tracked tensors get the rest.
  const std::uint64_t tracked = config_.gpu_budget - config_.hole_bytes;
  if (config_.plan_margin && config_.gpu_budget > 0 && *config_.plan_margin >= tracked) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("plan_margin (", format_bytes(*config_.plan_margin),
                    ") must be below the budget tracked tensors get (", format_bytes(tracked), ")"));
  }
  copier_ = make_copier(device_, config_.copy_order, config_.copy_chunk_bytes);
  if (config_.hold_copies_to_map)
    copy_holds_ = std::make_unique<PagedCopyHolds>(*copier_, *config_.hold_copies_to_map);
  io::EngineConfig engine;
  engine.host_capacity = config_.host_budget;
  engine.ssd_paths = config_.ssd_paths;
  engine.ssd_capacity_per_path = config_.ssd_capacity;
  engine.rank = config_.rank;
  // Pinning a large host tier takes seconds (pages are faulted in): done on a thread.
  engine.pin_host_in_background = true;
  engine.wrap_backend = config_.wrap_backend;
  engine.enqueue_host_copies = config_.enqueue_host_copies;
  store_ = std::make_unique<io::TierStore>(*copier_, engine);
  memory_ = std::make_unique<StorageMemory>(table_, *copier_, device_, callback_parts_, config_.reuse_blocks);
  runtime::ExecutorConfig executor_config;
  executor_config.budget = tracked;
  executor_ = std::make_unique<runtime::Executor>(*store_, *memory_, executor_config);
  timer_ = make_op_timer(device_);

  hardware_.gpu_budget = tracked;
  if (config_.hole_bytes > 0) hole_ = std::make_unique<LargeRequestHole>(device_, config_.hole_bytes);
  hardware_.host_capacity = config_.host_budget;
  hardware_.ssd_capacity = config_.ssd_capacity * config_.ssd_paths.size();
  probe_bandwidths();

  phase_ = config_.warmup_steps > 0 ? SessionPhase::kWarmup : SessionPhase::kProfile;
  phase_steps_left_ = config_.warmup_steps > 0 ? config_.warmup_steps : config_.profile_steps;
  slot_ = observe(this);
  observing_ = true;
}

Session::~Session() {
  try {
    close();
  } catch (const std::exception& e) {
    log::warn(cat("closing the TeraIO session: ", e.what()));
    // The callbacks must never reach a destroyed session, whatever close() could not do.
    stop_observing(slot_);
  }
}

void Session::probe_bandwidths() {
  TierBandwidths measured;
  const bool need =
      config_.d2h_bandwidth <= 0 || config_.h2d_bandwidth <= 0 ||
      (!config_.ssd_paths.empty() && (config_.ssd_read_bandwidth <= 0 || config_.ssd_write_bandwidth <= 0));
  if (need && config_.gpu_budget > 0) measured = probe_tiers(*store_, *copier_, config_.probe_bytes);
  const auto pick = [](double given, double probed, double fallback) {
    if (given > 0) return given;
    return probed > 0 ? probed : fallback;
  };
  // Without a host tier there is nothing to probe the device link with; the PCIe figure then
  // only bounds SSD traffic, which the SSD figures bound more tightly anyway.
  hardware_.d2h_bandwidth = pick(config_.d2h_bandwidth, measured.d2h, 25e9);
  hardware_.h2d_bandwidth = pick(config_.h2d_bandwidth, measured.h2d, 25e9);
  hardware_.ssd_write_bandwidth = pick(config_.ssd_write_bandwidth, measured.ssd_write, 1e9);
  hardware_.ssd_read_bandwidth = pick(config_.ssd_read_bandwidth, measured.ssd_read, 1e9);
  hardware_.pcie_duplex_bandwidth = config_.pcie_duplex_bandwidth;
  hardware_.request_latency_s = config_.request_latency_s.value_or(hardware_.request_latency_s);
  hardware_.gpudirect = false;
}

std::uint64_t Session::plan_margin() const {
  if (hardware_.gpu_budget == 0) return 0;  // nothing is planned
  return config_.plan_margin.value_or(std::min(kDefaultPlanMargin, hardware_.gpu_budget / 256));
}

std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> Session::locations() {
  std::lock_guard lock(mutex_);
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> out;
  if (!observing_) return out;
  remove_dead();
  table_.for_each([&](c10::StorageImpl* impl, TrackedStorage& entry) {
    if (entry.weak.expired() || !executor_->contains(entry.id)) return;
    auto& slot = out[std::string(runtime::to_string(executor_->location(entry.id)))];
    slot.first += 1;
    slot.second += impl->nbytes();
  });
  return out;
}

std::string Session::device_name() const {
  return device_.str();
}

std::string Session::engine_report() const {
  std::lock_guard lock(mutex_);
  if (!store_) return closed_engine_report_;
  return io::format_report(store_->report());
}

runtime::Mode Session::step_mode() const {
  if (config_.gpu_budget == 0) return runtime::Mode::kPassive;
  return phase_ == SessionPhase::kPlanned ? runtime::Mode::kPlanned : runtime::Mode::kReactive;
}

void Session::check_between_steps(std::string_view call) {
  if (phase_ == SessionPhase::kClosed) throw Error(ErrorKind::kShutdown, "the TeraIO session is closed");
  if (in_step_) {
    throw Error(ErrorKind::kInvalidArgument,
                cat(call, " inside session.step()", call == "session.step()" ? ": steps do not nest" : ""));
  }
  if (resident_depth_ > 0) throw Error(ErrorKind::kInvalidArgument, cat(call, " inside session.resident()"));
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
}

void Session::begin_step() {
  std::lock_guard lock(mutex_);
  check_between_steps("session.step()");
  in_step_ = true;
  op_counter_ = 0;
  host_syncs_ = 0;
  first_host_sync_.clear();
  births_previous_ = std::move(births_);
  births_ = Births{};
  diverged_ = false;
  // Only planned steps hold the hole (their first operator takes it); counts are per step.
  if (hole_) {
    hole_->release();
    static_cast<void>(hole_->take_counts());
    hole_take_failed_ = false;
  }
  if (phase_ == SessionPhase::kProfile) {
    recorder_.begin(config_.keep_copies);
    releases_.clear();
  }
  timing_planned_step_ = phase_ == SessionPhase::kPlanned && retime_left_ > 0 && observing_;
  if (timing_ops()) timer_->reset();
  if (observing_) {
    executor_->set_mode(step_mode());
    executor_->begin_step();
  }
  // Not in a step timed for retiming either: its operator times would take in the host's waits.
  copier_->serve_plan(step_mode() == runtime::Mode::kPlanned && !timing_planned_step_);
  callback_ns_.store(0, std::memory_order_relaxed);
  callback_parts_.take_s();
  static_cast<void>(copier_->take_link_activity());  // the step's own from here
  step_start_ = std::chrono::steady_clock::now();
  // The first step of a new plan starts where the plan does: without this, the tensors the
  // plan has away at each step's start stay where the step before (reactive) left them, and
  // the first micro-batches evict them reactively (W3: 370 evictions, 1.6 s, session 31).
  // Inside the step's time and link record: it is this step's traffic.
  if (observing_ && position_due_ && step_mode() == runtime::Mode::kPlanned) {
    position_due_ = false;
    memory_->at_op(0);  // its device waits are operator 0's, as the executor counts them
    try {
      executor_->position_for_plan();
    } catch (...) {
      record_failure(std::current_exception(), {});
    }
  }
}

void Session::remove_dead() {
  for (const TensorId id : table_.sweep_dead()) executor_->remove_tensor(id);
  memory_->hand_back_settled(*executor_);
}

StepRecord Session::end_step() {
  std::lock_guard lock(mutex_);
  if (!in_step_) throw Error(ErrorKind::kInvalidArgument, "end of a step that was not begun");
  in_step_ = false;
  copier_->serve_plan(false);  // between steps (resident(), close(), ...) no plan is served
  StepRecord record;
  record.step = step_index_++;
  record.phase = phase_;
  record.ops = op_counter_;
  record.host_syncs = host_syncs_;  // counted from begin_step, which resets them
  record.first_host_sync = first_host_sync_;
  if (record.host_syncs > 0 && phase_ == SessionPhase::kPlanned && device_.is_cuda() && !host_syncs_said_) {
    // Said once: each sync empties the GPU's queue, and the GPU then waits while the host
    // launches again through the callbacks (W3: ~40 ms a micro-batch, bench/RESULTS.md session 39).
    log::info(
        cat("TeraIO: planned step ", record.step, " made the host wait for the device ", record.host_syncs,
            " times (first: ", record.first_host_sync,
            "); under TeraIO each costs GPU time while the host catches up: copy inputs from pinned memory "
            "with non_blocking=True and keep .item(), .cpu() and tensor conditions out of the step"));
    host_syncs_said_ = true;
  }
#ifdef TERAIO_TORCH_CUDA
  // Honest step times: the step ends when its kernels have.
  if (device_.is_cuda()) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
  record.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  record.callback_s = static_cast<double>(callback_ns_.exchange(0, std::memory_order_relaxed)) * 1e-9;
  record.callback_parts_s = callback_parts_.take_s();
  record.link = copier_->take_link_activity();
  if (observing_) {
    remove_dead();
    if (phase_ == SessionPhase::kPlanned && trace_ && op_counter_ != trace_->ops.size() && !diverged_) {
      diverge(cat("the step ran ", op_counter_, " operators, the profiled one ", trace_->ops.size()));
    }
    record.stats = executor_->end_step();
    device_waits_.clear();
    record.device_stall_s = memory_->collect_device_stall(&device_waits_);
    record.blocks_reused = memory_->collect_blocks_reused();
    const StorageMemory::FetchFlushes flushes = memory_->collect_fetch_flushes();
    record.fetch_flushes = flushes.count;
    record.fetch_flush_s = static_cast<double>(flushes.ns) * 1e-9;
    if (hole_) {
      // Between steps the budget's bytes are the program's (evaluation, checkpoints, resident()).
      hole_->release();
      const LargeRequestHole::Counts hole = hole_->take_counts();
      record.hole_opened = hole.opened;
      record.hole_taken = hole.taken;
      record.hole_take_flushes = hole.take_flushes;
    }
    record.diverged = diverged_;
    if (timeline_steps_.size() < 16) timeline_steps_.push_back(record.stats);
    if (record.stats.late_free_evictions > 0 && !config_.record_releases && !late_frees_said_) {
      // Said once: the plan counts these storages free at their last use (bench/RESULTS.md,
      // session 35: the offline model puts W2's 33-35 evictions a step at 16 GiB down to them).
      log::info(cat("TeraIO: ", record.stats.late_free_evictions, " of planned step ", record.step, "'s ",
                    record.stats.evictions,
                    " evictions are for storages the program holds past their last use, which the plan "
                    "counts free there; Session(record_releases=True) profiles when they are freed and "
                    "plans for them"));
      late_frees_said_ = true;
    }
  }
  if (diverged_) {
    if (++divergent_steps_ >= 2) {
      log::warn("TeraIO: two steps in a row diverged from the profile; profiling again");
      phase_ = SessionPhase::kProfile;
      phase_steps_left_ = config_.profile_steps;
      retiming_.reset();
      retime_left_ = 0;
      divergent_steps_ = 0;
      steps_.push_back(record);
      if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
      return record;
    }
  } else {
    divergent_steps_ = 0;
  }
  // Planning after a completed step: a failure is recorded with the step, then raised.
  const auto plan_now = [&](auto&& plan) {
    try {
      plan();
    } catch (const std::exception& error) {
      record.plan_error = error.what();
      steps_.push_back(record);
      throw;
    }
    record.planned_now = true;
  };
  if (std::exchange(timing_planned_step_, false)) {
    // Used up by a divergent step too: callers count the steps that retime as warm-up.
    --retime_left_;
    if (!diverged_ && !pending_error_ && phase_ == SessionPhase::kPlanned) {
      plan_now([&] { retime(); });
      record.retimed = true;
    }
  }
  if (phase_ == SessionPhase::kProfile && !pending_error_) {
    const std::uint64_t step = record.step;
    // Freed by now or still held (a tensor kept across steps, freed in the next): to the end.
    releases_.drain([&](TensorId id) { recorder_.release(id, op_counter_); });
    const auto durations = timer_->durations(recorder_.ops());
    trace_ = recorder_.finish(
        durations,
        [&](TensorId id) {
          c10::StorageImpl* impl = table_.find_id(id);
          const TrackedStorage* entry = impl != nullptr ? table_.find(impl) : nullptr;
          return entry != nullptr && entry->born_step < step;
        },
        cat("profiled by TeraIO on ", device_.str()));
  }
  if (phase_ == SessionPhase::kWarmup || phase_ == SessionPhase::kProfile) {
    if (--phase_steps_left_ <= 0) {
      if (phase_ == SessionPhase::kWarmup) {
        phase_ = SessionPhase::kProfile;
        phase_steps_left_ = config_.profile_steps;
      } else if (!pending_error_) {
        retiming_.reset();  // a plan from a new profile, on the profile's times
        plan_now([&] { make_plan(); });
        retime_left_ = phase_ == SessionPhase::kPlanned ? config_.retime_steps : 0;
      }
    }
  }
  steps_.push_back(record);
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
  return record;
}

void Session::abort_step() {
  std::lock_guard lock(mutex_);
  if (!in_step_) return;
  in_step_ = false;
  copier_->serve_plan(false);
  if (hole_) hole_->release();
  if (observing_) {
    remove_dead();
    static_cast<void>(executor_->end_step());
  }
  // Cut short, the step did not reach the plan's end state.
  position_due_ = true;
  step_index_++;
  // The step's own exception is what the program sees; when a storage-engine error caused it,
  // that error is raised instead (Python chains the two).
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
}

void Session::reprofile() {
  std::lock_guard lock(mutex_);
  check_between_steps("session.reprofile()");
  if (!observing_) {
    slot_ = observe(this);
    observing_ = true;
    remove_dead();  // storages freed while nothing was observed
    phase_ = SessionPhase::kWarmup;
  }
  if (phase_ == SessionPhase::kWarmup) {
    // Storages made while nothing observed them (before the session, or while passive) must be
    // seen in a warm-up step to be known as living across steps: the warm-up runs in full.
    phase_steps_left_ = std::max(1, config_.warmup_steps);
  } else {
    phase_ = SessionPhase::kProfile;
    phase_steps_left_ = config_.profile_steps;
  }
  // The old plan names the old step's operators: it is dropped, not left to be reported.
  plan_.reset();
  prediction_.reset();
  retiming_.reset();
  retime_left_ = 0;
  trace_.reset();
  divergent_steps_ = 0;
}

std::uint64_t Session::track(const std::vector<at::Tensor>& tensors) {
  std::lock_guard lock(mutex_);
  check_between_steps("session.track()");
  if (phase_ != SessionPhase::kWarmup || !observing_) {
    throw Error(
        ErrorKind::kInvalidArgument,
        cat("session.track() is for tensors that exist before the session's first steps; the session is ",
            to_string(phase_), " (track before the first step, with warmup_steps >= 1)"));
  }
  std::uint64_t bytes = 0;
  for (const at::Tensor& tensor : tensors) {
    if (!movable(tensor)) continue;
    const c10::Storage& storage = tensor.storage();
    if (table_.find(storage.unsafeGetStorageImpl()) != nullptr) continue;
    identify(storage, FirstSight{}, {});
    bytes += storage.nbytes();
  }
  return bytes;
}

void Session::go_passive() {
  if (hole_) hole_->release();
  // Nothing to move: the steps of a model that fits cost what they cost without TeraIO. The
  // storages stay in the table (all resident), so that after reprofile() the executor counts
  // the ones a step has not touched yet, such as optimizer state before the optimizer runs;
  // without them reactive eviction would hold the budget over too little and the step could
  // run out of device memory.
  bring_everything_back();
  stop_observing(slot_);
  observing_ = false;
  phase_ = SessionPhase::kPassive;
}

void Session::diverge(const std::string& why) {
  if (diverged_) return;
  diverged_ = true;
  executor_->set_mode(runtime::Mode::kReactive);
  copier_->serve_plan(false);
  // The rest runs reactively: the plan's late offloads do not happen, so the next planned step
  // must put the device where the plan starts again.
  position_due_ = true;
  if (!divergence_reported_) {
    log::warn(cat("TeraIO: step ", step_index_, " diverged from the profiled operator sequence (", why,
                  "); this step runs in reactive mode"));
    divergence_reported_ = true;
  }
}

std::vector<TensorId> Session::tracked_ids(const std::vector<at::Tensor>& tensors) {
  std::vector<TensorId> ids;
  if (tensors.empty()) {
    table_.for_each([&](c10::StorageImpl*, TrackedStorage& entry) {
      if (!entry.weak.expired()) ids.push_back(entry.id);
    });
    return ids;
  }
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (const TrackedStorage* entry = table_.find(t.storage().unsafeGetStorageImpl())) {
      if (std::find(ids.begin(), ids.end(), entry->id) == ids.end()) ids.push_back(entry->id);
    }
  }
  return ids;
}

std::uint64_t Session::enter_resident(const std::vector<at::Tensor>& tensors) {
  std::lock_guard lock(mutex_);
  if (in_step_) throw Error(ErrorKind::kInvalidArgument, "session.resident() inside session.step()");
  if (phase_ == SessionPhase::kClosed) throw Error(ErrorKind::kShutdown, "the TeraIO session is closed");
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
  ++resident_depth_;
  if (!observing_) return 0;
  const std::uint64_t bytes = offloaded_bytes(tensors);
  try {
    remove_dead();
    executor_->set_mode(runtime::Mode::kPassive);
    const std::vector<TensorId> ids = tracked_ids(tensors);
    // The next planned step starts with these on the device wherever the plan has them away
    // (before the fetch: one that fails part-way has brought some back).
    position_due_ = true;
    executor_->fetch(ids);
    // resident() is for code that reads or writes storage directly, which the session cannot
    // see: the copies kept of these tensors may be stale when it ends.
    executor_->written(ids);
  } catch (...) {
    --resident_depth_;
    throw;
  }
  return bytes;
}

void Session::exit_resident() {
  std::lock_guard lock(mutex_);
  if (resident_depth_ > 0) --resident_depth_;
}

std::vector<DeviceWait> Session::device_waits() const {
  std::lock_guard lock(mutex_);
  return device_waits_;
}

void Session::export_timeline(const std::string& path) const {
  std::lock_guard lock(mutex_);
  runtime::write_timeline(path, op_spans_, timeline_steps_);
}

}  // namespace teraio::torch_binding
