"""What held the host up during a training step, beside TeraIO's own operator callbacks.

train_llm.py's --gpu-profile shows where the GPU waited for the host. Two causes outside
TeraIO show up there as host time without a CUDA call: Python's garbage collector (a full
collection over a large model's objects takes milliseconds, and saved-tensor hooks make
Python objects per saved tensor) and the CUDA caching allocator's slow path (a cap hit frees
cached blocks and retries; expandable segments map and unmap memory). HostWatch counts both
per step: the collector through gc.callbacks, the allocator from torch.cuda.memory_stats.
"""
from __future__ import annotations

import contextlib
import gc
import time

import torch

# torch.cuda.memory_stats counters of the allocator's slow paths (absent ones read as 0).
ALLOCATOR_COUNTERS = {"num_alloc_retries": "alloc_retries", "num_device_alloc": "device_allocs",
                      "num_device_free": "device_frees", "num_sync_all_streams": "allocator_syncs"}
# teraio.paged's counters, where the paged allocator replaces the caching one (prefixed "paged_").
PAGED_COUNTERS = ("allocations", "reused", "split_blocks", "joined_blocks", "grown_blocks", "mapped_blocks",
                  "pages_mapped", "pages_unmapped", "taken_blocks", "device_waits", "map_s", "access_s",
                  "unmap_s", "slow_maps", "slow_map_s", "slow_unmaps", "slow_unmap_s", "copy_holds",
                  "copy_holds_not_quiet", "copy_hold_s")


class HostWatch:
    def __init__(self, device):
        self.device = device
        self.gc_s = 0.0
        self.collections = 0
        self._started = None
        gc.callbacks.append(self._on_gc)

    def close(self):
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.gc_s += time.perf_counter() - self._started
            self.collections += 1
            self._started = None

    def _allocator(self):
        if self.device.type != "cuda":
            return {}
        import teraio.paged
        if (paged := teraio.paged.stats()) is not None:
            return {f"paged_{name}": paged[name] for name in PAGED_COUNTERS}
        stats = torch.cuda.memory_stats(self.device)
        return {name: stats.get(key, 0) for key, name in ALLOCATOR_COUNTERS.items()}

    @contextlib.contextmanager
    def step(self):
        """Yields a dict that holds, once the block is done, the step's collector time and
        collections and the allocator counters' growth."""
        gc_s, collections, allocator = self.gc_s, self.collections, self._allocator()
        fields = {}
        yield fields
        after = self._allocator()
        fields.update(gc_s=self.gc_s - gc_s, gc_collections=self.collections - collections,
                      **{name: after[name] - allocator[name] for name in after})


def freeze_collector():
    """Collects, then moves every object the collector tracks into its permanent generation
    (gc.freeze), so that later full collections do not scan them. On W3 a full collection over
    the model's objects took about 0.3 s every other step, on the host, whose time the GPU waits
    for under TeraIO (bench/RESULTS.md, session 41). Frozen objects are still freed when
    unreferenced; cycles among them are not. Returns how many objects are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def describe(summary):
    """One line from a mode's summary (medians per measured step), or None without data."""
    if summary.get("gc_s") is None:
        return None
    line = f"Python's collector {summary['gc_s']:.3f} s ({summary['gc_collections']:g} collections)"
    if summary.get("alloc_retries") is not None:
        line += (f"; CUDA allocator {summary['alloc_retries']:g} retries after freeing its cache, "
                 f"{summary['device_allocs']:g} device allocations and {summary['device_frees']:g} frees")
        if summary.get("fetch_flushes") is not None:
            line += (f" ({summary['fetch_flushes']:g} of the retries inside TeraIO's fetch allocations, "
                     f"{summary['fetch_flush_s']:.3f} s)")
    if summary.get("paged_allocations") is not None:
        line += "; " + describe_paged(summary)
    return line + " per measured step (median)"


def describe_paged(counts):
    """teraio.paged's counters of one step, or of a summary's medians, in words."""
    return (f"paged allocator {counts['paged_reused']:g} blocks reused in place ({counts['paged_split_blocks']:g} split, "
            f"{counts['paged_joined_blocks']:g} joined), {counts['paged_grown_blocks']:g} grown in place, "
            f"{counts['paged_mapped_blocks']:g} mapped ({counts['paged_pages_mapped']:g} pages, "
            f"{counts['paged_pages_unmapped']:g} unmapped), {counts['paged_taken_blocks']:g} freed blocks' pages taken, "
            f"{counts['paged_device_waits']:g} device-side waits, {counts['paged_map_s']:.3f} s mapping "
            f"({counts['paged_access_s']:.3f} s of it setting access) and {counts['paged_unmap_s']:.3f} s unmapping, "
            f"{counts['paged_slow_maps']:g} mappings over 10 ms ({counts['paged_slow_map_s']:.3f} s) and "
            f"{counts['paged_slow_unmaps']:g} unmappings ({counts['paged_slow_unmap_s']:.3f} s)"
            + (f", copies held for {counts['paged_copy_holds']:g} requests ({counts['paged_copy_hold_s']:.3f} s waiting "
               f"for the link, {counts['paged_copy_holds_not_quiet']:g} not quiet in time)"
               if counts.get("paged_copy_holds") else ""))
