"""Where one training step's GPU time goes, from a torch.profiler (Kineto/CUPTI) trace.

train_llm.py --gpu-profile runs one extra step of a mode under the profiler and summarizes it
here: how long the compute stream ran kernels, how long it sat idle and whether a copy was
running meanwhile (waiting for TeraIO's transfers) or not (waiting for the host: Python,
the autograd engine, TeraIO's callbacks), and what bandwidth the copies reached, one way and
both ways at once. The simulator assumes each direction runs at the probed bandwidth
independently; this measures what they did.
"""
from __future__ import annotations

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


def summarize_trace(path):
    """Summary of a Chrome trace exported by torch.profiler (times in seconds, rates in GB/s)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
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
    return summary


def describe(summary):
    if "error" in summary:
        return summary["error"]
    rate = lambda d: f"{summary[d]['busy_gbps']:.1f} GB/s" if summary[d]["busy_gbps"] else "-"  # noqa: E731
    return (f"GPU span {summary['gpu_span_s']:.3f} s: kernels {summary['compute_busy_s']:.3f} s, compute idle "
            f"{summary['compute_idle_s']:.3f} s ({summary['compute_idle_during_copies_s']:.3f} s while copies ran, "
            f"{summary['compute_idle_without_copies_s']:.3f} s with none; gaps over 100 us: "
            f"{summary['compute_gaps_over_100us']}, {summary['compute_gaps_over_100us_s']:.3f} s, "
            f"{summary['compute_gaps_over_100us_during_copies_s']:.3f} s of it while copies ran); d2h {summary['d2h']['bytes'] / 2**30:.1f} "
            f"GiB busy {summary['d2h']['busy_s']:.3f} s at {rate('d2h')}, h2d {summary['h2d']['bytes'] / 2**30:.1f} GiB "
            f"busy {summary['h2d']['busy_s']:.3f} s at {rate('h2d')}, both at once {summary['both_directions_s']:.3f} s")
