"""The step record's fetch_flushes / fetch_flush_s: the caching allocator's flushes (retries
after freeing its whole cache) that happened inside TeraIO's own fetch allocations, and their
time. They tell a flush TeraIO brought on from one an operator's allocation did (W3, RESULTS.md)."""
from __future__ import annotations

import torch

from conftest import requires_cuda
from test_session_reuse_blocks import run as take_turns

ELEMENTS = 1 << 20  # 4 MiB fp32 storages


def run(device):
    """Three storages take turns under a budget of two (reactive eviction alone), so every use
    of one that is away fetches it. Returns the step records."""
    steps, _ = take_turns(reuse=False, sizes=(ELEMENTS,) * 3, device=device)
    return steps


def test_off_cuda_no_fetch_is_counted_as_flushing():
    steps = run("cpu")
    assert sum(s["demand_fetches"] for s in steps) > 0
    assert [(s["fetch_flushes"], s["fetch_flush_s"]) for s in steps] == [(0, 0.0)] * len(steps)


@requires_cuda
def test_on_cuda_fetch_flushes_are_some_of_the_allocators_retries():
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["num_alloc_retries"]
    steps = run("cuda")
    retries = torch.cuda.memory_stats()["num_alloc_retries"] - before
    assert sum(s["demand_fetches"] for s in steps) > 0
    assert sum(s["fetch_flushes"] for s in steps) <= retries
    # A flushing fetch takes time; a step without one has none to report.
    assert all((s["fetch_flushes"] > 0) == (s["fetch_flush_s"] > 0) for s in steps), steps
