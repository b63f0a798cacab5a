"""teraio.Session: lifetime-aware tensor offloading for an ordinary PyTorch training loop."""
import contextlib
import os
import sys

import torch

from . import _native, paged, recast

_PHASES_THAT_PLAN = ("warmup", "profile")


def _size(value, name):
    if value is None:
        return 0
    try:
        return _native.parse_bytes(value)
    except _native.Error as error:
        raise ValueError(f"{name}: {error}") from None


def _held_copies(value):
    """hold_copies_to_map: False (no hold), True or "both", or "to_host" (also spelt "to-host", as
    the bench's --hold-copies and the native side spell it)."""
    if value is False or value is None:
        return None
    if value is True or value == "both":
        return "both"
    if value in ("to_host", "to-host"):
        return "to-host"
    raise ValueError(f"hold_copies_to_map must be False, True, 'both' or 'to_host' (got {value!r})")


def _device(value):
    if value is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    if isinstance(value, int):
        return f"cuda:{value}"
    device = torch.device(value)
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _error(message, kind):
    """A teraio.Error raised from Python, with its kind as the native ones have it."""
    error = _native.Error(message)
    error.kind = kind
    return error


def _unsupported(message):
    return _error(message, "unsupported")


def _refuse_what_bypasses_the_observer():
    """torch.compile and CUDA graphs run kernels without dispatching operators, so TeraIO could
    neither see their tensors' uses nor fetch them back: refused, never half-supported."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise _unsupported("session.step() during CUDA graph capture: CUDA graphs are not supported by TeraIO")
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        try:
            compiled = dynamo.utils.counters["frames"].get("ok", 0)
        except Exception:  # noqa: BLE001 - the counters are internal: no counters, nothing compiled seen
            compiled = 0
        if compiled:
            raise _unsupported(
                "torch.compile has compiled code in this process: compiled graphs run kernels without "
                "dispatching operators, which TeraIO needs to observe; train eagerly under a Session"
            )


def _collect_tensors(objects):
    tensors, seen = [], set()

    def visit(obj):
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                tensors.append(obj.detach())
        elif isinstance(obj, torch.nn.Module):
            for t in obj.parameters():
                visit(t)
            for t in obj.buffers():
                visit(t)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                visit(state)
            for group in obj.param_groups:
                visit(group["params"])
        elif isinstance(obj, dict):
            for value in obj.values():
                visit(value)
        elif isinstance(obj, (list, tuple, set)):
            for value in obj:
                visit(value)

    visit(objects)
    return tensors


def _free_device_memory(device):
    """Bytes the device can still give, or None when unknown."""
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        free, _ = torch.cuda.mem_get_info(index)
        cached = paged.memory_held(index) - paged.memory_in_use(index)
        return free + cached
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Report(dict):
    """What a session did: a dict (see README) whose str() is a human summary."""

    def to_dict(self):
        return dict(self)

    def __str__(self):
        fb = _native.format_bytes
        lines = [f"TeraIO session on {self['device']} ({self['phase']})"]
        budget = self["gpu_budget"]
        lines.append(
            f"  budget {fb(budget) if budget else 'unlimited'}, footprint {fb(self['footprint_bytes'])}"
            f" (peak tracked memory without migrations), host tier {fb(self['host_budget'])}"
        )
        plan = self["plan"]
        if plan.get("planned"):
            if plan["stall_free"]:
                fit = "fits"
            elif plan["feasible"]:
                fit = f"fits with {plan['planned_wait_s']:.3f} s of planned waits: no stall-free plan does"
            else:
                fit = "over budget: reactive eviction covers the rest"
            lines.append(
                f"  plan: {plan['migrations']} migrations, peak {fb(plan['peak_before'])} -> {fb(plan['peak_after'])}"
                f" ({fit}),"
                f" {fb(plan['bytes_to_ssd'])} to SSD and {fb(plan['bytes_to_host'])} to host per step"
                f" ({fb(plan.get('bytes_dropped', 0))} more dropped, their tier copies kept),"
                f" planned in {plan['planning_s']:.2f} s"
            )
            if plan.get("retimed_steps"):
                lines.append(
                    f"  retimed from {plan['retimed_steps']} planned step(s): operators"
                    f" {plan['profiled_step_s_before_retime']:.3f} s -> {plan['profiled_step_s']:.3f} s,"
                    f" predicted step {plan['predicted_step_s_before_retime']:.3f} s ->"
                    f" {plan['predicted_step_s']:.3f} s"
                )
        lines.append(f"  hardware: {plan.get('hardware', '')}")
        lines.append("  step  phase     mode      time(s)  stall(s)  out        in         demand  evict  peak")
        for s in self["steps"]:
            lines.append(
                f"  {s['step']:>4}  {s['phase']:<8}  {s['mode']:<8}  {s['time_s']:7.3f}  {s['stall_s']:8.3f}"
                f"  {fb(s['bytes_offloaded']):>9}  {fb(s['bytes_prefetched']):>9}  {s['demand_fetches']:>6}"
                f"  {s['evictions']:>5}  {fb(s['peak_resident'])}{'  diverged' if s['diverged'] else ''}"
            )
        lines.append("  storage engine:")
        lines.extend("    " + line for line in self["backends"].splitlines())
        return "\n".join(lines)


class Session:
    """Observes the first steps, plans migrations, and carries them out on every later step.

    See the README ("Python API") for every argument and the report's fields.
    """

    def __init__(
        self,
        gpu_budget=None,
        host_budget=0,
        ssd=(),
        ssd_capacity="8GiB",
        warmup_steps=1,
        profile_steps=2,
        device=None,
        plan_filter=None,
        bandwidths=None,
        min_tensor_bytes=4096,
        rank=None,
        _fault_injection=False,
        _enqueue_host_copies=None,
        _count_cpu_host_syncs=False,
        record_releases=True,
        copy_order="deadline",
        copy_chunk=None,
        hold_copies_to_map=False,
        recast_weights=False,
        recast_activations=False,
        keep_copies=False,
        retime_steps=0,
        stall_rounds=None,
        early_prefetch_lead=None,
        min_migration_share=None,
        reuse_blocks=False,
        hole_bytes=0,
        request_latency=None,
        plan_margin=None,
    ):
        if isinstance(ssd, (str, os.PathLike)):
            ssd = [ssd]
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        self._device = _device(device)
        self._gpu_budget = _size(gpu_budget, "gpu_budget")
        self._host_budget = _size(host_budget, "host_budget")
        self._plan_filter = plan_filter
        config = {
            "device": self._device,
            "gpu_budget": self._gpu_budget,
            "host_budget": self._host_budget,
            "ssd": [str(p) for p in ssd],
            "ssd_capacity": _size(ssd_capacity, "ssd_capacity") if ssd else 0,
            "warmup_steps": int(warmup_steps),
            "profile_steps": int(profile_steps),
            "retime_steps": int(retime_steps),
            "stall_rounds": None if stall_rounds is None else int(stall_rounds),
            "early_prefetch_lead": None if early_prefetch_lead is None else float(early_prefetch_lead),
            "min_migration_share": None if min_migration_share is None else float(min_migration_share),
            "min_tensor_bytes": _size(min_tensor_bytes, "min_tensor_bytes"),
            "rank": int(rank),
            "fault_injection": bool(_fault_injection),
            "count_cpu_host_syncs": bool(_count_cpu_host_syncs),
            "enqueue_host_copies": _enqueue_host_copies,
            "record_releases": bool(record_releases),
            "copy_order": str(copy_order),
            "copy_chunk": None if copy_chunk is None else _size(copy_chunk, "copy_chunk"),
            "hold_copies_to_map": _held_copies(hold_copies_to_map),
            "keep_copies": bool(keep_copies),
            "reuse_blocks": bool(reuse_blocks),
            "hole_bytes": _size(hole_bytes, "hole_bytes"),
        }
        if plan_margin is not None:
            config["plan_margin"] = _size(plan_margin, "plan_margin")
        if request_latency is not None:
            latency = float(request_latency)
            if not 0 <= latency <= 1:
                raise ValueError(f"request_latency must be between 0 and 1 second (got {request_latency!r})")
            config["request_latency"] = latency
        for key, value in (bandwidths or {}).items():
            if key not in ("d2h", "h2d", "ssd_read", "ssd_write", "duplex"):
                raise ValueError(f"bandwidths: unknown key {key!r} (d2h, h2d, ssd_read, ssd_write, duplex)")
            config[key] = float(value)
        self._native = _native.Session(config)
        self.last_step = None
        # teraio.recast inside every step: None when off, else the counts so far.
        self.recasts = recast.Recasts() if recast_weights or recast_activations else None
        self._recast_weights, self._recast_activations = bool(recast_weights), bool(recast_activations)

    @property
    def phase(self):
        return self._native.phase

    @property
    def device(self):
        return self._native.device

    @property
    def retime_steps_left(self):
        """Planned steps still to time their operators before the session plans again."""
        return self._native.retime_steps_left

    @contextlib.contextmanager
    def step(self):
        """One training step: forward, backward and optimizer step."""
        _refuse_what_bypasses_the_observer()
        self._native.begin_step()
        try:
            with (recast.saved_tensors(self.recasts, self._recast_weights, self._recast_activations)
                  if self.recasts is not None else contextlib.nullcontext()):
                yield self
        except BaseException:
            self._native.abort_step()
            raise
        self.last_step = self._native.end_step()
        if self.last_step["planned_now"] and self._plan_filter is not None:
            self._native.set_migrations(list(self._plan_filter(self._native.migrations())))

    def device_waits(self):
        """Where the last step's ``device_stall_s`` went: a list of ``(op, kind, seconds, how, at, tensor)``,
        one per wait for a copy that held the compute stream, in the order queued. ``op`` is the
        index of the operator whose callbacks queued the wait (it holds that operator's kernels,
        or the next one's); ``kind`` is ``"copy in"`` (a tensor not back yet), ``"copy out"``
        (memory not free yet) or ``"abandoned copy out"``; ``how`` is where the copy stood then:
        ``"queued"`` (all of it on its stream already), ``"flushed"`` (the rest put on the
        link's stream then), ``"gated"`` (the rest put on the side stream behind a device-side
        wait for the compute marker the copy was issued at: the host had run ahead of the GPU)
        or ``"done"``; ``at`` is when the GPU reached the wait, in seconds after it reached the
        step's first wait (the GPU time between two waits, less the profile's operator times
        between them, is time the plan does not count: ``bench/device_stalls.py``); ``tensor`` is
        the id of the tensor whose copy it waited for, as the trace and the plan name it. Empty on
        a CPU or while not observing."""
        return self._native.device_waits()

    @contextlib.contextmanager
    def resident(self, *objects):
        """Tracked tensors back in device memory, for code that reads storage directly
        (torch.save, .numpy(), data_ptr()).

        With no arguments every tracked tensor comes back; otherwise only those of the given
        tensors, modules (parameters and buffers), optimizers (state) and containers of them.
        They may exceed the budget while inside (the budget governs steps); what cannot fit in
        the device's free memory is refused before anything moves: bring back fewer at a time.
        """
        tensors = _collect_tensors(objects)
        if objects and not tensors:
            raise ValueError("resident(): no tensors in the given objects")
        needed = self._native.offloaded_bytes(tensors)
        free = _free_device_memory(self.device)
        if free is not None and needed > free:
            raise _native.Error(
                f"resident(): {_native.format_bytes(needed)} would have to come back but only "
                f"{_native.format_bytes(free)} is free on {self.device}; bring back fewer tensors at a time "
                "(e.g. resident(model), then resident(optimizer))"
            )
        self._native.enter_resident(tensors)
        try:
            yield self
        finally:
            self._native.exit_resident()

    def track(self, *objects):
        """Tracks the tensors of the given modules (parameters and buffers), optimizers (state)
        and containers from now on, before the first step: when they already exist (resuming
        from a checkpoint), the warm-up's reactive eviction then counts them before an operator
        touches them, which keeps a capped device from running out of memory. Returns the bytes
        newly tracked."""
        tensors = _collect_tensors(objects)
        if objects and not tensors:
            raise ValueError("track(): no tensors in the given objects")
        return self._native.track(tensors)

    def reprofile(self):
        """The training step changed on purpose (e.g. recomputation of some layers turned on or
        off): the next steps are profiled and planned anew, as the first ones were. From the
        passive phase a warm-up step comes first."""
        self._native.reprofile()

    def keep_plan(self):
        """The plan this planned session runs, with the profile it was made from: a copy that
        `use_plan()` can put back later for the same step. Raises teraio.Error in another phase."""
        return self._native.keep_plan()

    def use_plan(self, kept):
        """Runs a plan this session's `keep_plan()` returned from the next step on, without
        profiling again (retimes still due when it was kept run again). The step must be the one
        it was profiled from (one that is not diverges and runs reactively, as from any plan).
        Only between steps of a planned session; from another phase `reprofile()` is the way
        back to a plan."""
        self._native.use_plan(kept)

    def locations(self):
        """Tracked storages by where their bytes are: {"device": (count, bytes), "ssd": ...}."""
        return {k: tuple(v) for k, v in self._native.locations().items()}

    def migrations(self):
        return self._native.migrations()

    def report(self):
        plan = self._native.plan_summary()
        return Report(
            device=self.device,
            phase=self.phase,
            gpu_budget=self._gpu_budget,
            host_budget=self._host_budget,
            footprint_bytes=plan["footprint_bytes"],
            planned_peak_bytes=plan.get("peak_after", 0),
            plan=plan,
            steps=self._native.steps(),
            backends=self._native.engine_report(),
        )

    def save_trace(self, path):
        self._native.save_trace(os.fspath(path))

    def save_plan(self, path):
        self._native.save_plan(os.fspath(path))

    def export_timeline(self, path):
        self._native.export_timeline(os.fspath(path))

    def close(self):
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        native = getattr(self, "_native", None)
        if native is not None:
            try:
                native.close()
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass

    def _set_faults(self, reads=False, writes=False):
        self._native.set_faults(reads, writes)
