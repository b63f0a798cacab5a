"""Where one training step's GPU time goes, from a torch.profiler (Kineto/CUPTI) trace.

train_llm.py --gpu-profile runs one extra step of a mode under the profiler and summarizes it
here: how long the compute stream ran kernels, how long it sat idle and whether a copy was
running meanwhile (waiting for TeraIO's transfers) or not (waiting for the host: Python,
the autograd engine, TeraIO's callbacks), and what bandwidth the copies reached, one way and
both ways at once. The simulator assumes each direction runs at the probed bandwidth
independently; this measures what they did.

Each long idle gap of the compute stream is split at the moment the host launched the kernel
that ends it (CUPTI's correlation id links the two): before the launch the GPU waited for the
host ("host late"), after it the queued kernel waited on the device, for an event of a
transfer ("device wait"). For the host-late part, the CUDA runtime calls that the launching
thread sat in meanwhile are summed by name: a cudaEventSynchronize or a cudaMalloc there says
what held the host up. For the device-wait part, the copy that landed as the wait ended is taken
as the one waited for: whether it shared its direction of the link with another stream's copies
(the lane beside a copy on the side stream) or had it alone, and whether it had begun before the
wait or only after, say whether the copy ran slow or started late.
"""
from __future__ import annotations

import bisect
import json


def _union(intervals):
    """Total length of the union of (start, end) intervals, and the merged intervals."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(end - start for start, end in merged), merged


def _overlap(a, b):
    """Length of the intersection of two merged interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class _Scopes:
    """The host-side scopes (operators, annotations such as the optimizer's step) of a trace,
    per thread, to name what was being run when a kernel was launched. Scopes of one thread
    nest, so one sweep gives each its parent; every scope around a time is an ancestor of the
    last scope begun by then."""

    def __init__(self, events):
        self.by_thread = {}
        for e in events:
            if e.get("cat") in ("cpu_op", "user_annotation") and "dur" in e:
                self.by_thread.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        self.parents, self.starts = {}, {}
        for tid, scopes in self.by_thread.items():
            scopes.sort(key=lambda s: (s[0], -s[1]))
            parents, stack = [], []
            for i, (start, _, _) in enumerate(scopes):
                # A scope ends its open ones that ended before it began (not those whose end is
                # rounded a little past a child's: the child still nests).
                while stack and scopes[stack[-1]][1] <= start:
                    stack.pop()
                parents.append(stack[-1] if stack else -1)
                stack.append(i)
            self.parents[tid], self.starts[tid] = parents, [s[0] for s in scopes]

    def at(self, tid, t):
        """(outermost, innermost) names of the scopes around time t on a thread, or None."""
        scopes = self.by_thread.get(tid)
        if not scopes:
            return None
        parents = self.parents[tid]
        i = bisect.bisect_right(self.starts[tid], t) - 1
        while i >= 0 and scopes[i][1] < t:
            i = parents[i]
        if i < 0:
            return None
        outer = i
        while parents[outer] >= 0:
            outer = parents[outer]
        return scopes[outer][2], scopes[i][2]


def _split_gaps(gaps, enders, runtime, scopes=None):
    """Host-late and device-wait time of the gaps (us), the host-late time by runtime call, and
    by the outermost and innermost host scope that launched the kernel ending the gap.

    gaps: [start, end] idle intervals; enders: the kernel event that ends each gap; runtime:
    the trace's cuda_runtime events, from which each kernel's launch is found by correlation."""
    launches = {e["args"].get("correlation"): e for e in runtime if "correlation" in e.get("args", {})}
    by_thread = {}
    for e in runtime:
        by_thread.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    for calls in by_thread.values():
        calls.sort()
    starts = {tid: [c[0] for c in calls] for tid, calls in by_thread.items()}
    host_late = device_wait = unmatched = 0.0
    held_by, outer, inner, during = {}, {}, {}, {}
    waits = []  # the device-wait part of each gap
    for (g0, g1), ender in zip(gaps, enders):
        launch = launches.get(ender["args"].get("correlation"))
        if launch is None:
            unmatched += g1 - g0
            continue
        late_end = min(max(launch["ts"], g0), g1)
        host_late += late_end - g0
        device_wait += g1 - late_end
        if g1 > late_end:
            waits.append((late_end, g1))
        named = scopes.at(launch.get("tid"), launch["ts"]) if scopes is not None else None
        if named is not None and late_end > g0:
            outer[named[0]] = outer.get(named[0], 0.0) + late_end - g0
            inner[named[1]] = inner.get(named[1], 0.0) + late_end - g0
        if scopes is not None:
            _sample_scopes(scopes, launch.get("tid"), g0, late_end, during)
        calls, keys = by_thread[launch.get("tid")], starts[launch.get("tid")]
        # One thread's runtime calls do not overlap: only the last one begun before the gap
        # can reach into it.
        i = max(0, bisect.bisect_left(keys, g0) - 1)
        while i < len(calls) and calls[i][0] < late_end:
            a, b, name = calls[i]
            shared = min(b, late_end) - max(a, g0)
            if shared > 0:
                held_by[name] = held_by.get(name, 0.0) + shared
            i += 1
    return host_late, device_wait, unmatched, held_by, outer, inner, during, waits


SAMPLE_US = 10


def _sample_scopes(scopes, tid, start, end, during):
    """Adds to during[name] the time of [start, end) the thread spent in each innermost scope
    (sampled every SAMPLE_US us; "(no operator)" outside every scope). The scope at the launch
    is the operator whose kernel came late; this is what the thread did while it was late: an
    operator that allocated for long, or time between operators (Python, the autograd engine)."""
    t = start
    while t < end:
        step = min(SAMPLE_US, end - t)
        named = scopes.at(tid, t + step / 2)
        name = named[1] if named is not None else "(no operator)"
        during[name] = during.get(name, 0.0) + step
        t += step


# A device wait ends when the copy it waited for lands: the copy that ended last, at most this
# long before the kernel started, is taken as the one waited for.
AWAITED_SLACK_US = 50


def _direction(copy):
    return "d2h" if "DtoH" in copy["name"] else "h2d" if "HtoD" in copy["name"] else None


def _awaited_copies(waits, copies):
    """What the device-wait parts of the gaps ([start, end] us) waited for: the copy that ended
    last before each wait ended (within AWAITED_SLACK_US). Splits the waits' time by whether that
    copy shared its direction of the link with copies on other streams for over half its time
    (the copier's lane beside a copy waited for on its side stream) or had it alone, and by
    whether it had begun before the wait began or only after (a copy that started late, not one
    that ran slow), and gives the rate the awaited copies moved at."""
    by_end = sorted((c["ts"] + c["dur"], i) for i, c in enumerate(copies) if _direction(c))
    ends = [end for end, _ in by_end]
    by_direction = {}
    for c in copies:
        if direction := _direction(c):
            by_direction.setdefault(direction, []).append((c["ts"], c["ts"] + c["dur"], c["args"].get("stream")))
    starts, longest = {}, {}
    for direction, spans in by_direction.items():
        spans.sort()
        starts[direction] = [span[0] for span in spans]
        longest[direction] = max(end - start for start, end, _ in spans)
    out = {"waits": len(waits), "unmatched_s": 0.0, "by_direction_s": {}, "link_shared_s": 0.0, "link_alone_s": 0.0,
           "started_after_wait_began_s": 0.0, "awaited_bytes": 0, "awaited_busy_s": 0.0}
    for w0, w1 in waits:
        i = bisect.bisect_right(ends, w1 + 1) - 1  # a copy ends, then the kernel starts (1 us of rounding)
        if i < 0 or ends[i] < w1 - AWAITED_SLACK_US:
            out["unmatched_s"] += (w1 - w0) / 1e6
            continue
        copy = copies[by_end[i][1]]
        direction, c0, c1, stream = _direction(copy), copy["ts"], copy["ts"] + copy["dur"], copy["args"].get("stream")
        spans, keys = by_direction[direction], starts[direction]
        others = []
        for j in range(bisect.bisect_left(keys, c0 - longest[direction]), bisect.bisect_left(keys, c1)):
            start, end, other_stream = spans[j]
            if other_stream != stream and end > c0:
                others.append((max(start, c0), min(end, c1)))
        shared, _ = _union(others)
        seconds = (w1 - w0) / 1e6
        out["by_direction_s"][direction] = out["by_direction_s"].get(direction, 0.0) + seconds
        out["link_shared_s" if shared > (c1 - c0) / 2 else "link_alone_s"] += seconds
        if c0 > w0:
            out["started_after_wait_began_s"] += seconds
        out["awaited_bytes"] += copy["args"].get("bytes", 0)
        out["awaited_busy_s"] += (c1 - c0) / 1e6
    busy = out["awaited_busy_s"]
    out["awaited_gbps"] = out["awaited_bytes"] / busy / 1e9 if busy else None
    return out


def summarize_trace(path):
    """Summary of a Chrome trace exported by torch.profiler (times in seconds, rates in GB/s)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    # Kernels are launched through the runtime (cudaLaunchKernel) or the driver (cuLaunchKernel).
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "ts" in e]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "dur" in e]
    if not kernels:
        return {"error": "the trace has no kernels (CUPTI unavailable?)"}
    by_stream = {}
    for e in kernels:
        by_stream.setdefault(e["args"].get("stream"), []).append((e["ts"], e["ts"] + e["dur"]))
    compute = max(by_stream, key=lambda s: sum(end - start for start, end in by_stream[s]))
    busy, busy_merged = _union(by_stream[compute])
    start = min(e["ts"] for e in kernels + copies)
    end = max(e["ts"] + e["dur"] for e in kernels + copies)
    idle = [[a[1], b[0]] for a, b in zip(busy_merged, busy_merged[1:]) if b[0] > a[1]]
    # Launch gaps of a few microseconds between kernels are normal; longer ones are waits.
    long_idle = [iv for iv in idle if iv[1] - iv[0] >= 100]
    first_at = {}  # the compute kernel starting at a time: each gap ends at one
    for e in kernels:
        if e["args"].get("stream") == compute:
            first_at.setdefault(e["ts"], e)
    summary = {"gpu_span_s": (end - start) / 1e6, "compute_stream": compute, "compute_busy_s": busy / 1e6,
               "compute_idle_s": ((end - start) - busy) / 1e6, "kernels": len(kernels)}
    directions = {}
    for name, key in (("d2h", "DtoH"), ("h2d", "HtoD")):
        chosen = [e for e in copies if key in e["name"]]
        total, merged = _union([(e["ts"], e["ts"] + e["dur"]) for e in chosen])
        moved = sum(e["args"].get("bytes", 0) for e in chosen)
        directions[name] = merged
        summary[name] = {"copies": len(chosen), "bytes": moved, "busy_s": total / 1e6,
                         "busy_gbps": moved / total / 1e3 if total else None}
    both = _overlap(directions["d2h"], directions["h2d"])
    any_copy, any_merged = _union([tuple(iv) for iv in directions["d2h"] + directions["h2d"]])
    summary["both_directions_s"] = both / 1e6
    summary["any_copy_s"] = any_copy / 1e6
    # Idle compute time while some copy ran: waiting for transfers (or merely coinciding with
    # them); idle with no copy running: waiting for the host.
    idle_with_copy = _overlap(idle, any_merged)
    summary["compute_idle_during_copies_s"] = idle_with_copy / 1e6
    summary["compute_idle_without_copies_s"] = (sum(b - a for a, b in idle) - idle_with_copy) / 1e6
    summary["compute_gaps_over_100us"] = len(long_idle)
    summary["compute_gaps_over_100us_s"] = sum(b - a for a, b in long_idle) / 1e6
    summary["compute_gaps_over_100us_during_copies_s"] = _overlap(long_idle, any_merged) / 1e6
    late, wait, unmatched, held_by, outer, inner, during, waits = _split_gaps(
        long_idle, [first_at[g1] for _, g1 in long_idle], runtime, _Scopes(events))
    summary["device_waits_awaited"] = _awaited_copies(waits, copies)
    summary["gaps_host_late_s"] = late / 1e6
    summary["gaps_device_wait_s"] = wait / 1e6
    summary["gaps_unattributed_s"] = unmatched / 1e6
    top = sorted(held_by.items(), key=lambda kv: -kv[1])[:8]
    summary["gaps_host_late_in_runtime_calls_s"] = {name: t / 1e6 for name, t in top}
    # Which host scope launched the kernel the GPU waited for: the autograd node, optimizer
    # step or forward operator the host was late in.
    for key, by_name in (("gaps_host_late_by_outer_scope_s", outer), ("gaps_host_late_by_inner_scope_s", inner),
                         ("gaps_host_late_during_scope_s", during)):
        summary[key] = {name: t / 1e6 for name, t in sorted(by_name.items(), key=lambda kv: -kv[1])[:8]}
    return summary


def held(summary):
    calls = summary.get("gaps_host_late_in_runtime_calls_s") or {}
    shown = ", ".join(f"{name} {t:.3f} s" for name, t in list(calls.items())[:4])
    return f" (host in {shown})" if shown else ""


def awaited(summary):
    """What the device waited for, in words (empty where the summary has no device waits)."""
    a = summary.get("device_waits_awaited")
    if not a or not a["waits"]:
        return ""
    rate = f"{a['awaited_gbps']:.1f} GB/s" if a["awaited_gbps"] else "-"
    directions = ", ".join(f"{d} {t:.3f} s" for d, t in sorted(a["by_direction_s"].items()))
    return (f"device waits ({a['waits']}) by the copy that ended as each wait did: {directions}; that copy shared its "
            f"direction with another stream for over half its time {a['link_shared_s']:.3f} s, had it alone "
            f"{a['link_alone_s']:.3f} s; it began only after the wait began {a['started_after_wait_began_s']:.3f} s; "
            f"the awaited copies moved at {rate} while they ran; no copy ended there {a['unmatched_s']:.3f} s")


def late_scopes(summary):
    """The scopes the host was late in, for printing (longest first)."""
    lines = []
    for key, what in (("gaps_host_late_by_outer_scope_s", "by the outermost scope that launched the kernel waited for"),
                      ("gaps_host_late_by_inner_scope_s", "by the innermost scope that launched the kernel waited for"),
                      ("gaps_host_late_during_scope_s", "by the innermost scope the launching thread was in meanwhile")):
        shown = ", ".join(f"{name} {t:.3f} s" for name, t in list((summary.get(key) or {}).items())[:5])
        if shown:
            lines.append(f"host late, {what}: {shown}")
    return lines


def describe(summary):
    if "error" in summary:
        return summary["error"]
    rate = lambda d: f"{summary[d]['busy_gbps']:.1f} GB/s" if summary[d]["busy_gbps"] else "-"  # noqa: E731
    return (f"GPU span {summary['gpu_span_s']:.3f} s: kernels {summary['compute_busy_s']:.3f} s, compute idle "
            f"{summary['compute_idle_s']:.3f} s ({summary['compute_idle_during_copies_s']:.3f} s while copies ran, "
            f"{summary['compute_idle_without_copies_s']:.3f} s with none; gaps over 100 us: "
            f"{summary['compute_gaps_over_100us']}, {summary['compute_gaps_over_100us_s']:.3f} s, "
            f"{summary['compute_gaps_over_100us_during_copies_s']:.3f} s of it while copies ran: "
            f"{summary.get('gaps_host_late_s', 0):.3f} s host late, {summary.get('gaps_device_wait_s', 0):.3f} s "
            f"device wait{held(summary)}); d2h {summary['d2h']['bytes'] / 2**30:.1f} "
            f"GiB busy {summary['d2h']['busy_s']:.3f} s at {rate('d2h')}, h2d {summary['h2d']['bytes'] / 2**30:.1f} GiB "
            f"busy {summary['h2d']['busy_s']:.3f} s at {rate('h2d')}, both at once {summary['both_directions_s']:.3f} s")
