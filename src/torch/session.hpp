// torch/session: one TeraIO session on one device. It observes every operator through
// PyTorch's RecordFunction callbacks, gives storages stable ids (StorageTable), records the
// profiled steps as a lifetime trace, plans with the planner, and drives the executor on
// every later step: before an operator, its storages are made resident; after it, the
// executor retires transfers and holds the budget. Phases: warm-up (optimizer state gets
// created), profile (reactive under the budget, trace recorded), planned (the plan is carried
// out; a divergent step falls back to reactive mode), passive (nothing to move: the observer
// is detached so a model that fits pays nothing).
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "callback_parts.hpp"
#include "large_request_hole.hpp"
#include "op_timer.hpp"
#include "paged_allocator.hpp"
#include "profile_recorder.hpp"
#include "storage_memory.hpp"
#include "storage_table.hpp"
#include "teraio/core/error.hpp"
#include "teraio/io/tier_store.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/runtime/executor.hpp"
#include "teraio/runtime/timeline.hpp"

namespace teraio::torch_binding {

inline constexpr std::uint64_t kDefaultPlanMargin = 64ull << 20;

struct SessionConfig {
  std::string device = "cpu";          // "cpu", "cuda", "cuda:N"
  std::uint64_t gpu_budget = 0;        // bytes tracked tensors may hold on the device; 0: unlimited
  std::uint64_t host_budget = 0;       // pinned host tier; 0: none
  std::vector<std::string> ssd_paths;  // "{rank}" substituted; empty: no SSD tier
  std::uint64_t ssd_capacity = 0;      // per path
  int warmup_steps = 1;
  int profile_steps = 2;
  // Planned steps after each plan from a profile that time every operator again and plan anew
  // with those times. The profile step runs host-bound under the observer, so its operator
  // times overstate what a planned step's kernels take (7-17% on the H100, bench/RESULTS.md);
  // a plan made on them issues its prefetches too late for the faster real step. 0: never.
  int retime_steps = 0;
  // The planner's stall search (plan::PlannerOptions::stall_rounds): more rounds can reach a
  // plan that fits where the stall-free one does not, at more planning time (W3: 64 rounds
  // about twice 24's). 0: none, the shortfall left to reactive eviction.
  int stall_rounds = plan::PlannerOptions{}.stall_rounds;
  // How far earlier the planner's early-prefetch pass may move a prefetch, in its own transfer
  // times (plan::PlannerOptions::early_prefetch_lead, 100); the pass stays within the budget.
  // Without record_releases it moves prefetches into memory the program has not given back yet
  // and evicts for it (bench/RESULTS.md, sessions 35-36).
  double early_prefetch_lead = plan::PlannerOptions{}.early_prefetch_lead;
  // Storages smaller than this share of the GPU budget are never planned to move
  // (plan::PlannerOptions::min_migration_share, 1/65536; reactive eviction may still move them):
  // their copies cost the runtime more than the memory they free (W3, bench/RESULTS.md, session 37).
  double min_migration_share = plan::PlannerOptions{}.min_migration_share;
  int rank = 0;
  std::uint64_t min_tensor_bytes = 4096;  // smaller storages are not worth an I/O request
  // Bandwidths in bytes/s for the planner; 0: measured by a probe of the tiers at start-up.
  double d2h_bandwidth = 0;
  double h2d_bandwidth = 0;
  double ssd_read_bandwidth = 0;
  double ssd_write_bandwidth = 0;
  // Both PCIe directions together while both are busy (plan::Hardware::pcie_duplex_bandwidth;
  // 94e9 on the H100 machines, bench/RESULTS.md session 19). Not probed: 0 plans each direction
  // at its own rate, as before.
  double pcie_duplex_bandwidth = 0;
  // Fixed cost per migration request in the plan (plan::Hardware::request_latency_s); none: the
  // planner's default. Plans are just in time, so a runtime with more latency per copy than
  // planned falls behind (bench/RESULTS.md, session 30); a plan for more latency issues earlier.
  std::optional<double> request_latency_s;
  // Bytes the plan leaves free below the budget the executor enforces. The runtime's count of
  // resident bytes runs a little above the simulator's at the budget's edge (W3 at 74 GiB: one
  // 32 MiB output, bench/RESULTS.md session 32), and each such shortfall evicts the idle tensor
  // used furthest ahead, which the plan keeps resident: a 2 GiB weight, fetched back on demand.
  // none: kDefaultPlanMargin, or a 256th of the budget where that is less.
  std::optional<std::uint64_t> plan_margin;
  std::uint64_t probe_bytes = 64ull << 20;
  // io::EngineConfig::enqueue_host_copies (tests force it on the CPU, where it is off).
  std::optional<bool> enqueue_host_copies;
  // Whether the profile records when each storage is freed (trace::Tensor::held_after_use), so
  // that the plan counts storages the program holds past their last use and may move them out
  // for good. Off plans as if every storage were freed at its last use and leaves the rest to
  // reactive eviction: on one H200 (bench/RESULTS.md, session 36) the gradients held until
  // zero_grad then cost W2 @ 16 GiB 30-36 evictions a step, and on ran it 3.8% and W3 1.4%
  // faster. Session 6 had on 5.9% slower at W2 @ 24 GiB, before most of today's runtime.
  bool record_releases = true;
  // Tests only: count host syncs (StepRecord::host_syncs) on a CPU session too, where every
  // tensor is on "the device" and so reads of host scalars (an optimizer's step count) would
  // count. Syncs are counted on CUDA sessions only otherwise.
  bool count_cpu_host_syncs = false;
  // Whether a tensor's copy may stay in its tier while the tensor is back on the device and
  // only read (a weight between micro-batches), so that moving it out again drops its device
  // memory instead of copying it (plan::Migration::kept_copy). Off: the profile records every
  // use as a write, and the plan keeps no copies. Off by default: on W3 offloading alone the
  // host tier ran full in the second planned step with it on (bench/RESULTS.md, session 12).
  bool keep_copies = false;
  // Whether the device block of a tensor moved out is kept, inside the budget, for a later fetch
  // of its size, instead of the caching allocator freeing one block and finding another
  // (StorageMemory, runtime::TensorMemory::spare_bytes). Spare blocks count against the budget, go
  // back before any tensor is moved out for room or a refused allocation is retried, are kept only
  // inside a step, and serve only fetches on the stream they were released on. Aimed at W3, where
  // the allocator's page maps take about 30% of the host's time at the device's limit
  // (bench/RESULTS.md, session 22). Off by default because it made W3 slower (session 24):
  // it served about 4 300 fetches per step, but the slack it holds is what the allocator lends
  // to operators' temporaries, and their flushes more than doubled. The step record counts
  // the fetches served (blocks_reused).
  bool reuse_blocks = false;
  // A device block of this many bytes that planned steps hold (not between steps) for the operators' largest
  // requests (LargeRequestHole): handed to the caching allocator just before an operator that
  // created a storage of more than half its size in the previous step, taken again once those
  // storages are freed or moved out. It counts in gpu_budget: tracked tensors get gpu_budget -
  // hole_bytes. 0: none, the default, because it made W3 slower (bench/RESULTS.md, session 24):
  // taking the block back takes the free run TeraIO's own large fetches then miss.
  std::uint64_t hole_bytes = 0;
  // The order the CUDA copier runs each direction's copies in (io::CopyOrder, which says what
  // each does): by the plan's deadlines as the simulator assumes (the default), one of the
  // deadline variants for copies waited for, or as issued. What ran is in the backends report.
  io::CopyOrder copy_order = io::CopyOrder::kDeadline;
  // The piece its deadline-order lanes queue at a time (io::checked_lane_chunk).
  std::size_t copy_chunk_bytes = io::kDefaultLaneChunkBytes;
  // The installed paged allocator holds this session's copies back, those of both directions or
  // those to the host, while it maps and unmaps (PagedCopyHolds): CUDA's mapping calls wait for
  // the copy engines, page by page, and for those copying out of the device above all (bench/
  // RESULTS.md sessions 43-44). Needs the paged allocator and a deadline copy order. nullopt: no
  // hold, the default until it has made W3 faster beyond the runs' noise (both ways: 1.4-2.1%
  // in two pairs, session 44).
  std::optional<io::HeldCopies> hold_copies_to_map;
  // Called (from the failing operator's thread) when a storage-engine error first hits a step,
  // so that the binding can stop the training code at its next Python statement.
  std::function<void()> on_failure;
  // Test seam handed to the storage engine (fault injection).
  std::function<std::unique_ptr<io::IoBackend>(std::unique_ptr<io::IoBackend>, const std::string&)>
      wrap_backend;
};

enum class SessionPhase { kWarmup, kProfile, kPlanned, kPassive, kClosed };
std::string_view to_string(SessionPhase phase);

// What the simulator predicts for the plan on the profiled trace, and the bandwidth bound no
// plan can beat: printed beside the measured step so that the model's error is visible.
struct PlanPrediction {
  double profiled_step_s = 0;  // sum of the profiled operator durations
  double step_s = 0;           // simulated step under the plan, budget enforced
  double stall_s = 0;
  double bound_step_s = 0;  // plan::step_time_bound
  std::string bound_reason;
};

// The operator times a planned step measured replaced the profile's (SessionConfig::retime_steps).
struct Retiming {
  int steps = 0;                // planned steps timed since the last profile
  double profiled_step_s = 0;   // the operator times summed, as profiled
  double predicted_step_s = 0;  // the plan made on them, simulated
};

// A plan with the profile it was made from and what was predicted of it, kept so that the same
// step can run it again later: recompute.tune() returns to a count it measured earlier without
// profiling it again, and so runs the plan it timed, not a new one from another profile.
struct KeptPlan {
  std::uint64_t session = 0;  // the serial of the session it was kept from: ids are its own
  trace::Trace trace;
  plan::PlanResult plan;
  std::optional<PlanPrediction> prediction;
  std::optional<Retiming> retiming;
  int retime_left = 0;  // planned steps still to time when kept (a plan not yet retimed)
};

struct StepRecord {
  std::uint64_t step = 0;
  SessionPhase phase = SessionPhase::kWarmup;
  runtime::StepStats stats;
  double time_s = 0;
  // GPU time the compute stream waited for copies handed to the device (CUDA; not in
  // stats.stall_s, which is the operator thread's own waiting).
  double device_stall_s = 0;
  // Fetches that got a spare block (reuse_blocks).
  std::uint64_t blocks_reused = 0;
  // The caching allocator's flushes inside TeraIO's fetch allocations, and their time (CUDA).
  std::uint64_t fetch_flushes = 0;
  double fetch_flush_s = 0;
  // The large-request hole (hole_bytes): blocks handed to operators, blocks taken, and the
  // allocator's flushes while taking them (CUDA).
  std::uint64_t hole_opened = 0;
  std::uint64_t hole_taken = 0;
  std::uint64_t hole_take_flushes = 0;
  // Host time the training threads spent in TeraIO's operator callbacks, nested operators'
  // included: the runtime's own overhead plus the operator thread's waits (stats.stall_s),
  // which delay kernel launches wherever the host is not far ahead of the GPU.
  double callback_s = 0;
  std::array<double, kCallbackParts> callback_parts_s{};  // parts of callback_s (callback_parts)
  // What each PCIe direction did during the step, from the CUDA copier's dispatchers (either
  // deadline order): whether copies ran late because the link was busy or because nothing was sent.
  std::optional<io::LinkActivities> link;
  // Operators that made the host wait for the device (host_syncs): after each the GPU waits
  // while the host launches again through TeraIO's callbacks. The first, in words.
  std::uint64_t host_syncs = 0;
  std::string first_host_sync;
  std::size_t ops = 0;
  bool diverged = false;
  bool planned_now = false;  // the plan was made at the end of this step
  bool retimed = false;      // ... from the operator times this planned step measured
  // Why planning at the end of this step failed (the step itself completed; end_step raised
  // the error): a caller trying steps on purpose, as recompute.tune() does, can go on.
  std::string plan_error;
};

class Session {
 public:
  explicit Session(SessionConfig config);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void begin_step();
  // Ends the step; rethrows the first storage-engine error the step met.
  StepRecord end_step();
  // The step's code raised: closes the step without planning from it, and rethrows the
  // storage-engine error that caused it, if one did.
  void abort_step();
  // Each wait for a copy that held the compute stream in the last step that ended, with the
  // operator that queued it (CUDA; empty elsewhere): where the step's device_stall_s went.
  std::vector<DeviceWait> device_waits() const;
  // Brings the given tensors' storages (every tracked one when empty) back into device memory,
  // above the budget if need be, and keeps the session from moving anything until
  // exit_resident(). Returns the bytes it had to fetch.
  std::uint64_t enter_resident(const std::vector<at::Tensor>& tensors);
  // Bytes enter_resident(tensors) would fetch.
  std::uint64_t offloaded_bytes(const std::vector<at::Tensor>& tensors);
  void exit_resident();
  // The training step changed on purpose (recomputation turned on or off for some layers):
  // the next steps are profiled again and planned anew, as after a divergence but without
  // waiting for two divergent steps. From the passive phase a warm-up step comes first, so
  // that the tensors that live across steps are known before the profile.
  void reprofile();
  // Tensors that exist before the session's first step (a resumed optimizer's state, the
  // parameters): tracked now, so that reactive eviction in the warm-up counts them before an
  // operator touches them. Without it, state the warm-up has not reached yet is memory the
  // budget does not see, and a capped device can run out. Only in the warm-up phase. Returns
  // the bytes newly tracked.
  std::uint64_t track(const std::vector<at::Tensor>& tensors);
  // The plan the session runs, with its profile (a copy); only in the planned phase.
  std::shared_ptr<KeptPlan> keep_plan();
  // Runs `kept` from the next step on, as if its profile had just been planned (its retimes still
  // due run as they would have). The step must be the one it was profiled from; one that is not
  // diverges, as it would from any plan. Only a plan this session kept, only in the planned
  // phase, between steps: from another phase the tensors that live across steps may not all be
  // tracked, and only a profile finds them.
  void use_plan(const KeptPlan& kept);
  void close();

  SessionPhase phase() const { return phase_; }
  const SessionConfig& config() const { return config_; }
  const std::vector<StepRecord>& steps() const { return steps_; }
  const std::optional<trace::Trace>& trace() const { return trace_; }
  const std::optional<plan::PlanResult>& plan() const { return plan_; }
  const std::optional<PlanPrediction>& prediction() const { return prediction_; }
  // Set once a planned step's operator times replaced the profile's.
  const std::optional<Retiming>& retiming() const { return retiming_; }
  // Planned steps still to be timed before planning again (SessionConfig::retime_steps).
  int retime_steps_left() const { return retime_left_; }
  // Replaces the plan's migrations (plan_filter); they must name tensors of the trace.
  void set_migrations(std::vector<plan::Migration> migrations);
  const plan::Hardware& hardware() const { return hardware_; }
  // The bytes the plan leaves free below the tracked budget (SessionConfig::plan_margin).
  std::uint64_t plan_margin() const;
  std::string engine_report() const;
  // Tracked storages by location ("device", "host", ...): count and bytes, for diagnosis.
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> locations();
  std::string device_name() const;
  void export_timeline(const std::string& path) const;

  // Observer entry points (any thread; operators of one session never run concurrently).
  struct OpState {
    bool counted = false;
    bool view = false;  // a top-level operator that only makes views: let pass (op_views)
    OpIndex k = 0;
    std::uint32_t nested = 0;
    std::vector<TensorId> used;     // its inputs first, then storages born in it
    std::size_t inputs = 0;         // how many of `used` are inputs
    std::vector<TensorId> written;  // inputs its schema says it may change
    const char* name = nullptr;
    double start_s = 0;
    // The depth of the host sync this thread is inside (host_syncs), -1 for none: a blocking
    // copy of a non-contiguous tensor runs a second copy_ inside the first, one wait in all.
    int sync_depth = -1;
  };
  void on_op_start(const at::RecordFunction& fn, OpState& op, int depth, trace::Phase phase);
  void on_op_end(const at::RecordFunction& fn, OpState& op, int depth);
  // Counts an operator that makes the host wait for the device (host_syncs), inside a step.
  void note_host_sync(std::string_view why);
  // Nanoseconds the observer spends in this session's callbacks (any thread, through a TimedNs),
  // for the step's record.
  std::atomic<std::uint64_t>& callback_ns() { return callback_ns_; }

 private:
  // Refuses `call` on a closed session, inside a step or inside resident(); raises a pending
  // storage-engine error.
  void check_between_steps(std::string_view call);
  bool on_device(const at::Tensor& tensor) const;
  // On the device and large enough to be worth moving (config.min_tensor_bytes).
  bool movable(const at::Tensor& tensor) const;
  void finish_op(const at::RecordFunction& fn, OpState& op, int depth,
                 const std::vector<c10::Storage>& outputs);
  // The storage's id, tracking it from now on when it is new; `in_use` are the storages of the
  // running operator, which making room for a fetch must not evict.
  TensorId identify(const c10::Storage& storage, const FirstSight& sight,
                    const std::vector<TensorId>& in_use);
  void refresh_size(const c10::Storage& storage, TrackedStorage& entry);
  void untrack(c10::StorageImpl* impl, TensorId id, const std::vector<TensorId>& in_use);
  void count_op(const at::RecordFunction& fn, OpState& op, trace::Phase phase);
  // `after_the_fact`: the operator was first seen at its end (no device inputs).
  void run_before_op(OpState& op, bool after_the_fact = false);
  void record_failure(std::exception_ptr error, const std::vector<TensorId>& used);
  // Copies kept of these tensors are stale (they are written); never throws (callbacks).
  void forget_kept_copies(std::span<const TensorId> ids);
  // The ids of the tracked storages among these (untracked ones are left out).
  std::vector<TensorId> ids_of(const std::vector<c10::Storage>& storages);
  // A nested operator may write storages its outermost operator's schema does not name.
  void note_nested_writes(const at::RecordFunction& fn);
  // Zeroed memory for a storage an operator is about to use without its bytes; never throws.
  void give_scratch(c10::StorageImpl* impl);
  void interrupt_if_due();
  // A budget error at an operator whose own tensors exceed the budget, said as such.
  std::exception_ptr explain_failure(const Error& error, const OpState& op);
  void remove_dead();
  std::uint64_t expected_births(OpIndex k) const;
  std::vector<TensorId> tracked_ids(const std::vector<at::Tensor>& tensors);
  // The planner's options from the session's config.
  plan::PlannerOptions planner_options() const;
  void make_plan();
  // The plan in plan_ (for trace_) becomes the one the executor carries out from the next step.
  void hand_plan_to_executor();
  // Plans again on the operator times the planned step just measured.
  void retime();
  void predict();
  void bring_everything_back();
  void go_passive();
  void stop_with_everything_back();
  void diverge(const std::string& why);
  runtime::Mode step_mode() const;
  void probe_bandwidths();

  // Whether operators' writes are looked for: the profile records them (keep_copies), or the
  // plan keeps copies that a write makes stale. Read by callbacks without the lock. Declared
  // before config_, which the constructor moves from after initializing this.
  std::atomic<bool> tracks_writes_{false};
  SessionConfig config_;
  c10::Device device_;
  std::unique_ptr<io::DeviceCopier> copier_;
  std::unique_ptr<PagedCopyHolds> copy_holds_;  // hold_copies_to_map; ends before copier_
  std::unique_ptr<io::TierStore> store_;
  StorageTable table_;
  CallbackParts callback_parts_;  // declared before memory_, which times into it
  std::unique_ptr<StorageMemory> memory_;
  std::unique_ptr<runtime::Executor> executor_;
  std::unique_ptr<OpTimer> timer_;
  ProfileRecorder recorder_;
  ReleaseWatch releases_;  // of the profiled step's own storages
  plan::Hardware hardware_;
  std::optional<trace::Trace> trace_;
  std::optional<plan::PlanResult> plan_;
  std::optional<PlanPrediction> prediction_;
  std::optional<Retiming> retiming_;
  int retime_left_ = 0;
  // This planned step times its operators for retime(). Set between steps, like phase_.
  bool timing_planned_step_ = false;
  bool position_due_ = false;  // a new plan: its first planned step positions (begin_step)
  // Whether this step's operators are timed: a profile step's, or a planned one's for retime().
  bool timing_ops() const { return phase_ == SessionPhase::kProfile || timing_planned_step_; }
  std::vector<std::string> plan_op_names_;
  std::unordered_map<TensorId, std::uint64_t> plan_bytes_;  // profiled size of each tensor
  // Bytes of storages each operator created in the previous step and in this one: the room
  // an operator needs for its outputs is made before it runs, so the budget holds throughout.
  // When the previous step's operator at this position was another one (the warm-up's
  // optimizer creates its state), the largest birth seen so far is reserved instead.
  struct Births {
    std::vector<std::uint64_t> bytes;
    std::vector<std::uint64_t> largest;  // the largest single storage (kept with a hole only)
    std::vector<std::string> names;
  };
  Births births_previous_;
  Births births_;
  std::uint64_t largest_birth_ = 0;
  // The largest storage operator k created in the previous step, 0 where that step's operator
  // at k was another one.
  std::uint64_t previous_largest_birth(OpIndex k) const;
  // Whether the previous step's operator at position k was the one running there now.
  bool same_operator_last_step(OpIndex k) const;
  std::unique_ptr<LargeRequestHole> hole_;  // hole_bytes > 0
  bool hole_take_failed_ = false;           // this step: not tried again until the next
  bool hole_take_warned_ = false;           // said once
  bool late_frees_said_ = false;            // said once (end_step)
  std::uint64_t host_syncs_ = 0;            // in this step (host_syncs); under mutex_
  std::string first_host_sync_;
  bool host_syncs_said_ = false;  // said once (end_step)
  void take_hole();
  void open_hole(OpIndex k);

  const std::uint64_t serial_;  // tells this session's kept plans from another's
  mutable std::recursive_mutex mutex_;
  SessionPhase phase_ = SessionPhase::kWarmup;
  int phase_steps_left_ = 0;
  bool observing_ = false;
  bool in_step_ = false;
  int resident_depth_ = 0;
  std::uint64_t step_index_ = 0;
  OpIndex op_counter_ = 0;
  std::uint64_t warmup_ids_ = 0;
  bool diverged_ = false;
  int divergent_steps_ = 0;
  bool divergence_reported_ = false;
  std::exception_ptr pending_error_;
  std::atomic<bool> interrupt_due_{false};
  std::atomic<std::uint64_t> callback_ns_{0};
  std::string closed_engine_report_;
  std::chrono::steady_clock::time_point step_start_;
  std::vector<StepRecord> steps_;
  std::vector<runtime::OpSpan> op_spans_;
  std::vector<runtime::StepStats> timeline_steps_;
  std::vector<DeviceWait> device_waits_;  // the last step's (device_waits())
  int slot_ = -1;                         // in the observer's registry
};

}  // namespace teraio::torch_binding
