"""Room for an operator's outputs: before each operator the runtime makes room for the bytes the
same operator created in the previous step. An operator that created nothing there (an
in-place update, an optimizer step) needs no room. It used to get the step's largest birth
as a guess. On W3 that phantom room evicted a 2 GiB weight at every optimizer step, fetched
back on demand, and about 100 tensors a step with prefetches moved further ahead (session 34)."""
from __future__ import annotations

import torch

import teraio

ELEMENTS = 4096  # 16 KiB fp32 storages: above the session's min_tensor_bytes
STORAGE = ELEMENTS * 4


def test_operators_that_create_nothing_get_no_room_for_outputs():
    a, b = torch.randn(ELEMENTS), torch.randn(ELEMENTS)
    a_before, b_before = a.clone(), b.clone()
    results = []

    def step():
        p = a * 2  # each of the first three operators creates one storage
        q = a * 3
        r = b * 4  # five storages: `a`, idle until the next step, must leave (the one eviction)
        for t in (p, q, r):  # in place: nothing new, and the four storages left fit exactly
            t.add_(1)
        results.append(sum(t.sum().item() for t in (p, q, r)))  # 4-byte results: not tracked

    # The plan moves nothing (the filter drops every migration): reactive eviction alone holds
    # the budget of four storages.
    with teraio.Session(gpu_budget=4 * STORAGE, host_budget=8 * STORAGE, device="cpu", warmup_steps=1,
                        profile_steps=1, plan_filter=lambda migrations: []) as session:
        for _ in range(5):
            with session.step():
                step()
        steps = session.report()["steps"]
    planned = [s for s in steps if s["phase"] == "planned"]
    assert len(planned) == 3 and all(s["mode"] == "planned" for s in planned)
    # Room for a guessed birth at the in-place updates evicts a second storage every step
    # (2 a step before the fix).
    assert [s["evictions"] for s in planned] == [1, 1, 1], planned
    assert all(s["demand_fetches"] <= 1 for s in planned), planned
    assert torch.equal(a, a_before) and torch.equal(b, b_before)
    assert len(set(results)) == 1
