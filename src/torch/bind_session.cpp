// teraio._native.Session: the native half of teraio.Session (python/teraio/session.py holds
// the Python half: argument checking, context managers, the report's formatting).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <array>

#include "bindings.hpp"
#include "fault_injection.hpp"
#include "session.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/plan/plan_io.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::torch_binding {
namespace {

// Seconds indexed by an enum (stall causes, callback parts), keyed by each value's name.
template <typename Enum, std::size_t N>
py::dict by_name(const std::array<double, N>& seconds) {
  py::dict d;
  for (std::size_t i = 0; i < N; ++i) d[py::str(std::string(to_string(static_cast<Enum>(i))))] = seconds[i];
  return d;
}

py::dict link_dict(const io::LinkActivity& a) {
  py::dict d;
  d["busy_s"] = a.busy_s;
  d["waiting_s"] = a.waiting_s;
  d["idle_s"] = a.idle_s;
  d["chunks"] = a.chunks;
  d["bytes"] = a.bytes;
  d["gated_flushes"] = a.gated_flushes;
  d["gated_bytes"] = a.gated_bytes;
  d["held_s"] = a.held_s;
  d["host_waited_s"] = a.host_waited_s;
  d["awaited"] = a.awaited;
  d["awaited_bytes"] = a.awaited_bytes;
  d["holds"] = a.holds;
  d["held_for_driver_s"] = a.held_for_driver_s;
  return d;
}

py::dict step_dict(const StepRecord& r) {
  const runtime::StepStats& s = r.stats;
  py::dict d;
  d["step"] = r.step;
  d["phase"] = std::string(to_string(r.phase));
  d["mode"] = std::string(runtime::to_string(s.mode));
  d["time_s"] = r.time_s;
  d["stall_s"] = s.stall_s;
  d["device_stall_s"] = r.device_stall_s;
  d["device_waits"] = s.device_waits;
  d["blocks_reused"] = r.blocks_reused;
  d["hole_opened"] = r.hole_opened;
  d["hole_taken"] = r.hole_taken;
  d["hole_take_flushes"] = r.hole_take_flushes;
  d["fetch_flushes"] = r.fetch_flushes;
  d["fetch_flush_s"] = r.fetch_flush_s;
  d["callback_s"] = r.callback_s;
  d["callback_parts_s"] = by_name<CallbackPart>(r.callback_parts_s);
  d["before_op_parts_s"] = by_name<runtime::BeforeOpPart>(s.before_op_s);
  d["allocation_retries"] = s.allocation_retries;
  d["freed_scans"] = s.freed_scans;
  d["freed_scan_s"] = s.freed_scan_s;
  d["stall_by_cause_s"] = by_name<runtime::StallCause>(s.stall_by_cause_s);
  d["bytes_to_host"] = s.bytes_to_host;
  d["bytes_to_ssd"] = s.bytes_to_ssd;
  d["bytes_from_host"] = s.bytes_from_host;
  d["bytes_from_ssd"] = s.bytes_from_ssd;
  d["bytes_offloaded"] = s.bytes_to_host + s.bytes_to_ssd;
  d["bytes_prefetched"] = s.bytes_from_host + s.bytes_from_ssd;
  d["planned_offloads"] = s.planned_offloads;
  d["planned_prefetches"] = s.planned_prefetches;
  d["demand_fetches"] = s.demand_fetches;
  d["evictions"] = s.evictions;
  d["late_free_evictions"] = s.late_free_evictions;
  d["positioned"] = s.positioned;
  d["positioned_back"] = s.positioned_back;
  d["cancelled_offloads"] = s.cancelled_offloads;
  d["bytes_abandoned"] = s.bytes_abandoned;
  d["skipped"] = s.skipped;
  d["dropped"] = s.dropped;
  d["bytes_dropped"] = s.bytes_dropped;
  d["copies_given_up"] = s.copies_given_up;
  d["peak_resident"] = s.peak_resident;
  d["ops"] = r.ops;
  d["host_syncs"] = r.host_syncs;
  d["first_host_sync"] = r.first_host_sync;
  d["diverged"] = r.diverged;
  d["plan_error"] = r.plan_error;
  d["planned_now"] = r.planned_now;
  if (r.link) {
    py::dict link;
    link["to_host"] = link_dict(r.link->to_host);
    link["to_device"] = link_dict(r.link->to_device);
    d["link"] = link;
  } else {
    d["link"] = py::none();
  }
  d["retimed"] = r.retimed;
  return d;
}

py::dict migration_dict(const plan::Migration& m) {
  py::dict d;
  d["tensor"] = m.tensor;
  d["bytes"] = m.bytes;
  d["direction"] = std::string(plan::to_string(m.direction));
  d["tier"] = std::string(plan::to_string(m.tier));
  d["issue_before"] = m.issue_before;
  d["deadline"] = m.deadline;
  d["urgent"] = m.urgent;
  d["kept_copy"] = m.kept_copy;
  return d;
}

plan::Migration migration_from(const py::dict& d) {
  plan::Migration m;
  m.tensor = d["tensor"].cast<std::uint64_t>();
  m.bytes = d["bytes"].cast<std::uint64_t>();
  const auto direction = d["direction"].cast<std::string>();
  if (direction != "offload" && direction != "prefetch") {
    throw Error(ErrorKind::kInvalidArgument,
                cat("migration direction must be offload or prefetch, not ", direction));
  }
  m.direction = direction == "offload" ? plan::Direction::kOffload : plan::Direction::kPrefetch;
  const auto tier = d["tier"].cast<std::string>();
  if (tier != "host" && tier != "ssd")
    throw Error(ErrorKind::kInvalidArgument, cat("tier must be host or ssd, not ", tier));
  m.tier = tier == "host" ? plan::Tier::kHost : plan::Tier::kSsd;
  m.issue_before = d["issue_before"].cast<std::uint32_t>();
  m.deadline = d["deadline"].cast<std::uint32_t>();
  m.urgent = d["urgent"].cast<bool>();
  if (d.contains("kept_copy")) m.kept_copy = d["kept_copy"].cast<bool>();
  return m;
}

// Where the training code runs: a storage-engine failure inside an operator cannot raise
// through PyTorch's callbacks, so the step's thread gets an asynchronous teraio.Error, raised at
// its next Python statement; the step's end then raises the real error with its message.
struct StepThread {
  std::atomic<unsigned long> id{0};
  std::atomic<bool> interrupted{false};
  void interrupt() {
    if (interrupted.exchange(true)) return;
    py::gil_scoped_acquire gil;
    // Between steps the failing operator runs on the calling Python thread itself.
    unsigned long thread = id.load();
    if (thread == 0) thread = PyThread_get_thread_ident();
    py::object error = py::module_::import("teraio._native").attr("Error");
    PyThreadState_SetAsyncExc(thread, error.ptr());
  }
  // Withdraws an interrupt that has not fired yet (the step ended first).
  void settle() {
    const unsigned long thread = id.exchange(0);
    if (thread != 0 && interrupted.exchange(false)) PyThreadState_SetAsyncExc(thread, nullptr);
  }
};

// The native session plus what only the binding owns (the fault switch of the tests).
struct NativeSession {
  std::shared_ptr<FaultSwitch> faults = std::make_shared<FaultSwitch>();
  std::shared_ptr<StepThread> step_thread = std::make_shared<StepThread>();
  std::unique_ptr<Session> session;
};

SessionConfig config_from(const py::dict& d, const std::shared_ptr<FaultSwitch>& faults) {
  SessionConfig c;
  const auto get = [&](const char* key, auto fallback) {
    return d.contains(key) && !d[key].is_none() ? d[key].cast<decltype(fallback)>() : fallback;
  };
  c.device = get("device", std::string("cpu"));
  c.gpu_budget = get("gpu_budget", std::uint64_t{0});
  c.host_budget = get("host_budget", std::uint64_t{0});
  c.ssd_paths = get("ssd", std::vector<std::string>{});
  c.ssd_capacity = get("ssd_capacity", std::uint64_t{0});
  c.warmup_steps = get("warmup_steps", 1);
  c.profile_steps = get("profile_steps", 2);
  c.retime_steps = get("retime_steps", 0);
  c.stall_rounds = get("stall_rounds", c.stall_rounds);
  c.early_prefetch_lead = get("early_prefetch_lead", c.early_prefetch_lead);
  c.min_migration_share = get("min_migration_share", c.min_migration_share);
  c.rank = get("rank", 0);
  c.min_tensor_bytes = get("min_tensor_bytes", std::uint64_t{4096});
  c.d2h_bandwidth = get("d2h", 0.0);
  c.h2d_bandwidth = get("h2d", 0.0);
  c.ssd_read_bandwidth = get("ssd_read", 0.0);
  c.ssd_write_bandwidth = get("ssd_write", 0.0);
  c.pcie_duplex_bandwidth = get("duplex", 0.0);
  c.probe_bytes = get("probe_bytes", c.probe_bytes);
  c.record_releases = get("record_releases", c.record_releases);
  c.count_cpu_host_syncs = get("count_cpu_host_syncs", false);
  c.keep_copies = get("keep_copies", false);
  c.reuse_blocks = get("reuse_blocks", false);
  c.hole_bytes = get("hole_bytes", std::uint64_t{0});
  c.copy_order = io::parse_copy_order(get("copy_order", std::string("deadline")));
  // None: the default piece; any number given, 0 included, is checked.
  if (d.contains("copy_chunk") && !d["copy_chunk"].is_none())
    c.copy_chunk_bytes =
        io::checked_lane_chunk(static_cast<std::size_t>(d["copy_chunk"].cast<std::uint64_t>()));
  // None: no hold; else "both" or "to-host" (teraio.Session maps True to "both").
  if (d.contains("hold_copies_to_map") && !d["hold_copies_to_map"].is_none())
    c.hold_copies_to_map = io::parse_held_copies(d["hold_copies_to_map"].cast<std::string>());
  if (d.contains("plan_margin") && !d["plan_margin"].is_none())
    c.plan_margin = d["plan_margin"].cast<std::uint64_t>();
  if (d.contains("request_latency") && !d["request_latency"].is_none())
    c.request_latency_s = d["request_latency"].cast<double>();
  if (d.contains("enqueue_host_copies") && !d["enqueue_host_copies"].is_none())
    c.enqueue_host_copies = d["enqueue_host_copies"].cast<bool>();
  if (get("fault_injection", false)) {
    c.wrap_backend = [faults](std::unique_ptr<io::IoBackend> real, const std::string&) {
      return make_faulty_backend(std::move(real), faults);
    };
  }
  return c;
}

}  // namespace

void bind_session(py::module_& m) {
  py::class_<KeptPlan, std::shared_ptr<KeptPlan>>(m, "KeptPlan")
      .def_property_readonly("operators", [](const KeptPlan& k) { return k.trace.ops.size(); })
      .def_property_readonly("migrations", [](const KeptPlan& k) { return k.plan.plan.migrations.size(); })
      .def_property_readonly("predicted_step_s",
                             [](const KeptPlan& k) -> py::object {
                               if (!k.prediction) return py::none();
                               return py::float_(k.prediction->step_s);
                             })
      .def("__repr__", [](const KeptPlan& k) {
        return cat("<teraio KeptPlan: ", k.trace.ops.size(), " operators, ", k.plan.plan.migrations.size(),
                   " migrations>");
      });
  py::class_<NativeSession>(m, "Session")
      .def(py::init([](const py::dict& config) {
             auto native = std::make_unique<NativeSession>();
             auto c = config_from(config, native->faults);
             c.on_failure = [thread = native->step_thread] { thread->interrupt(); };
             py::gil_scoped_release release;
             native->session = std::make_unique<Session>(std::move(c));
             return native;
           }),
           py::arg("config"))
      .def("begin_step",
           [](NativeSession& s) {
             s.session->begin_step();
             s.step_thread->interrupted = false;
             s.step_thread->id = PyThread_get_thread_ident();
           })
      .def("end_step",
           [](NativeSession& s) {
             s.step_thread->settle();
             StepRecord r;
             {
               py::gil_scoped_release release;
               r = s.session->end_step();
             }
             return step_dict(r);
           })
      .def("device_waits",
           [](const NativeSession& s) {
             py::list out;
             for (const DeviceWait& w : s.session->device_waits())
               out.append(py::make_tuple(w.op, to_string(w.kind), w.seconds,
                                         std::string(io::to_string(w.how)), w.at, w.tensor));
             return out;
           })
      .def("abort_step",
           [](NativeSession& s) {
             s.step_thread->settle();
             s.session->abort_step();
           })
      .def(
          "enter_resident",
          [](NativeSession& s, const std::vector<at::Tensor>& tensors) {
            py::gil_scoped_release release;
            return s.session->enter_resident(tensors);
          },
          py::arg("tensors"))
      .def(
          "offloaded_bytes",
          [](NativeSession& s, const std::vector<at::Tensor>& tensors) {
            return s.session->offloaded_bytes(tensors);
          },
          py::arg("tensors"))
      .def("exit_resident", [](NativeSession& s) { s.session->exit_resident(); })
      .def("reprofile", [](NativeSession& s) { s.session->reprofile(); })
      .def("keep_plan", [](NativeSession& s) { return s.session->keep_plan(); })
      .def(
          "use_plan", [](NativeSession& s, const KeptPlan& kept) { s.session->use_plan(kept); },
          py::arg("kept"))
      .def(
          "track",
          [](NativeSession& s, const std::vector<at::Tensor>& tensors) { return s.session->track(tensors); },
          py::arg("tensors"))
      .def("close",
           [](NativeSession& s) {
             py::gil_scoped_release release;
             s.session->close();
           })
      .def_property_readonly(
          "phase", [](const NativeSession& s) { return std::string(to_string(s.session->phase())); })
      .def_property_readonly("device", [](const NativeSession& s) { return s.session->device_name(); })
      .def_property_readonly("retime_steps_left",
                             [](const NativeSession& s) { return s.session->retime_steps_left(); })
      .def("steps",
           [](const NativeSession& s) {
             py::list out;
             for (const auto& r : s.session->steps()) out.append(step_dict(r));
             return out;
           })
      .def("migrations",
           [](const NativeSession& s) {
             py::list out;
             if (s.session->plan()) {
               for (const auto& mig : s.session->plan()->plan.migrations) out.append(migration_dict(mig));
             }
             return out;
           })
      .def("set_migrations",
           [](NativeSession& s, const py::list& list) {
             std::vector<plan::Migration> out;
             for (const auto& item : list) out.push_back(migration_from(item.cast<py::dict>()));
             s.session->set_migrations(std::move(out));
           })
      .def("plan_summary",
           [](const NativeSession& s) {
             py::dict d;
             const auto& result = s.session->plan();
             d["planned"] = result.has_value();
             if (result) {
               d["migrations"] = result->plan.migrations.size();
               d["feasible"] = result->plan.feasible;
               d["peak_before"] = result->plan.peak_before;
               d["peak_after"] = result->plan.peak_after;
               d["bytes_to_ssd"] = result->stats.bytes_to_ssd;
               d["bytes_to_host"] = result->stats.bytes_to_host;
               d["kept_copy_drops"] = result->stats.clean_offloads;
               d["bytes_dropped"] = result->stats.bytes_dropped;
               d["planning_s"] = result->stats.planning_s;
               d["message"] = result->diagnosis.message;
               d["min_feasible_budget"] = result->diagnosis.min_feasible_budget;
               d["stall_free"] = result->diagnosis.feasible;
               d["stall_rounds"] = result->stats.stall_rounds;
               d["planned_wait_s"] = result->stats.planned_wait_s;
               d["stall_free_step_s"] = result->stats.stall_free_step_s;
             }
             if (const auto& p = s.session->prediction()) {
               d["profiled_step_s"] = p->profiled_step_s;
               d["predicted_step_s"] = p->step_s;
               d["predicted_stall_s"] = p->stall_s;
               d["bound_step_s"] = p->bound_step_s;
               d["bound_reason"] = p->bound_reason;
             }
             if (const auto& r = s.session->retiming()) {
               d["retimed_steps"] = r->steps;
               d["profiled_step_s_before_retime"] = r->profiled_step_s;
               d["predicted_step_s_before_retime"] = r->predicted_step_s;
             }
             const auto& trace = s.session->trace();
             std::uint64_t footprint = 0;
             if (trace) {
               for (const std::uint64_t bytes : trace::memory_demand(*trace))
                 footprint = std::max(footprint, bytes);
             }
             d["footprint_bytes"] = footprint;
             d["trace_ops"] = trace ? trace->ops.size() : 0;
             d["trace_tensors"] = trace ? trace->tensors.size() : 0;
             d["hardware"] = s.session->hardware().describe();
             d["plan_margin_bytes"] = s.session->plan_margin();
             d["early_prefetch_lead"] = s.session->config().early_prefetch_lead;
             d["min_migration_share"] = s.session->config().min_migration_share;
             d["record_releases"] = s.session->config().record_releases;
             return d;
           })
      .def("locations", [](NativeSession& s) { return s.session->locations(); })
      .def("engine_report", [](const NativeSession& s) { return s.session->engine_report(); })
      .def("save_trace",
           [](const NativeSession& s, const std::string& path) {
             if (!s.session->trace())
               throw Error(ErrorKind::kInvalidArgument, "no step has been profiled yet");
             trace::save_trace(*s.session->trace(), path);
           })
      .def("save_plan",
           [](const NativeSession& s, const std::string& path) {
             if (!s.session->plan()) throw Error(ErrorKind::kInvalidArgument, "there is no plan yet");
             plan::write_plan(s.session->plan()->plan, path);
           })
      .def("export_timeline",
           [](const NativeSession& s, const std::string& path) { s.session->export_timeline(path); })
      .def("set_faults", [](NativeSession& s, bool reads, bool writes) {
        s.faults->fail_reads = reads;
        s.faults->fail_writes = writes;
      });
}

}  // namespace teraio::torch_binding
