"""Which allocations make the CUDA caching allocator flush its cache, for train_llm.py's --flush-sizes.

At the device's limit the allocator, finding no free block for a request and no room to map
more, unmaps every free block of its expandable segments (synchronizing before each unmap)
and tries again. W3 does this 80-100 times per step, and a profile puts about 30% of the host's
time in those page maps. The step record counts the flushes (num_alloc_retries) and those
inside TeraIO's own fetches, but not what asked for memory. This module records the
allocator's event history over one extra, unmeasured step (torch.cuda.memory's
_record_memory_history, Python stacks only) and names the request after each flush: its size
and the Python frames that made it. A flush shows in the history as a run of segment_unmap
events (segment_free without expandable segments, which free memory only there); the next
alloc is the request it served. A run followed by a free instead was an emptied cache
(torch.cuda.empty_cache(), TeraIO's trim), not a request's flush: it is counted apart.
Limits: a cache emptied just before an allocation (empty_cache() then a tensor, or TeraIO's
trim before retrying a refused fetch) reads as a flush for that allocation; a refused fetch
reads as two (its oom, then the retry). The Python frames do not say whether TeraIO's callback
or the operator itself asked: in the backward neither has a Python frame. The summary's
alloc_retries, the allocator's own count over the step, is there to check the history against.
"""
from __future__ import annotations

import collections

import torch

MIB = 1 << 20
# Frames of these files say nothing about which model code asked for memory.
_PLUMBING = ("torch/nn/modules/module.py", "torch/autograd/", "torch/utils/", "contextlib.py",
             "torch/_tensor.py", "torch/optim/optimizer.py", "torch/_dynamo/", "torch/overrides.py")


def site_of(frames, depth=2):
    """The innermost `depth` Python frames outside torch's plumbing, innermost first."""
    kept = []
    for frame in frames or ():
        name = frame.get("filename", "")
        if any(p in name for p in _PLUMBING):
            continue
        short = "/".join(name.split("/")[-2:])
        kept.append(f"{short}:{frame.get('line', '?')} {frame.get('name', '?')}")
        if len(kept) == depth:
            break
    return " < ".join(kept) if kept else "(no Python frame: autograd engine or a C++ thread)"


def summarize(trace, top=12):
    """Flushes in one device's allocator trace (a list of TraceEntry dicts, oldest first)."""
    flushes = []
    run = None  # the flush being read: unmaps so far
    for entry in trace:
        action = entry.get("action")
        # Expandable segments unmap pages; the classic allocator frees whole segments.
        if action in ("segment_unmap", "segment_free"):
            if run is None:
                run = {"unmaps": 0, "unmapped_bytes": 0}
            run["unmaps"] += 1
            run["unmapped_bytes"] += int(entry.get("size", 0))
        elif action == "alloc" and run is not None:
            run["size"] = int(entry.get("size", 0))
            run["site"] = site_of(entry.get("frames"))
            flushes.append(run)
            run = None
        elif action == "oom" and run is not None:
            run["size"] = int(entry.get("size", 0))
            run["site"] = "(out of memory)"
            flushes.append(run)
            run = None
        elif action in ("free_requested", "free_completed") and run is not None:
            # A flush inside malloc is followed by its request at once; a free first means the
            # cache was emptied outside an allocation (empty_cache, or TeraIO's trim).
            run["size"] = 0
            run["site"] = "(cache emptied outside an allocation)"
            flushes.append(run)
            run = None
    allocs = [e for e in trace if e.get("action") == "alloc"]
    big = [e for e in allocs if int(e.get("size", 0)) >= 256 * MIB]
    emptied = [f for f in flushes if f["size"] == 0]
    flushes = [f for f in flushes if f["size"] > 0]
    by_request = collections.Counter((f["size"], f["site"]) for f in flushes)
    by_size = collections.Counter(f["size"] for f in flushes)
    return {
        "flushes": len(flushes),
        "unmaps": sum(f["unmaps"] for f in flushes),
        "unmapped_bytes": sum(f["unmapped_bytes"] for f in flushes),
        "emptied": len(emptied),
        "allocs": len(allocs),
        "allocs_256mib_or_more": len(big),
        "flushes_for_256mib_or_more": sum(1 for f in flushes if f["size"] >= 256 * MIB),
        "by_size": [{"size": size, "flushes": n} for size, n in by_size.most_common(top)],
        "by_request": [{"size": size, "site": site, "flushes": n} for (size, site), n in by_request.most_common(top)],
        "unfinished": run is not None,
    }


def describe(summary):
    """Lines for the log: the totals, then the requests that brought flushes on most often."""
    s = summary
    lines = [f"{s['flushes']} flushes in the recorded step ({s['unmaps']} unmaps, "
             f"{s['unmapped_bytes'] / (1 << 30):.1f} GiB unmapped); {s['flushes_for_256mib_or_more']} of them "
             f"for requests of 256 MiB or more ({s['allocs_256mib_or_more']} such of {s['allocs']} allocations); "
             f"caches emptied outside an allocation: {s.get('emptied', 0)}"]
    if "alloc_retries" in s:
        lines.append(f"  the allocator counted {s['alloc_retries']} retries in the step"
                     + ("; the history is full: the step's first events are lost" if s.get("history_full") else ""))
    if s.get("unfinished"):
        lines.append("  the step ended inside a run of unmaps (not counted)")
    for row in s["by_request"]:
        lines.append(f"  {row['flushes']:4d} x {row['size'] / MIB:9.1f} MiB  {row['site']}")
    return lines


MAX_ENTRIES = 2_000_000  # W3's step records about 600 000 events


def _retries(device):
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0)


def record_one_step(run_step, device):
    """One more (unmeasured) step with the allocator's history on; its flushes summarized.
    run_step() runs the step and returns what notes its record, called once recording is over.

    The history is recorded for every device (PyTorch ignores the device here); this device's
    trace is read. The step counts in the session's totals (the recast notes) like any other.
    """
    record_history = torch.cuda.memory._record_memory_history
    retries_before = _retries(device)
    record_history(enabled="all", context="alloc", stacks="python", max_entries=MAX_ENTRIES)
    try:
        finish = run_step()
        torch.cuda.synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        record_history(enabled=None)
    finish()
    traces = snapshot.get("device_traces", [])
    index = device.index if device.index is not None else torch.cuda.current_device()
    trace = traces[index] if index < len(traces) else []
    summary = summarize(trace)
    # The allocator's own count, to check the history against: a retry with nothing to unmap
    # leaves no run of unmaps, and a full history has lost the step's first events.
    summary["alloc_retries"] = _retries(device) - retries_before
    summary["history_full"] = len(trace) >= MAX_ENTRIES
    return summary
