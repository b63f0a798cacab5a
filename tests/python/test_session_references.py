"""TeraIO holds no strong reference to a storage, not even while a transfer of it is in flight.

PyTorch decides some things by a storage's reference count: the autograd engine sums two
gradients of one tensor in place (aten::add_) only where it holds the last reference to the
first one's storage, and otherwise allocates (aten::add). A reference held by TeraIO would make
a planned step run other operators than its profile did (on PyTorch 2.11 it did: the step then
diverged and ran reactive; test_training_exact.py::test_sgd_momentum_exact[cpu] showed it).
"""
from __future__ import annotations

import time

import torch

import teraio
from teraio import _native

ELEMENTS = 4096  # 16 KiB fp32 storages: above the session's min_tensor_bytes
FAST = {key: 1e12 for key in ("d2h", "h2d", "ssd_read", "ssd_write")}  # so that the plan moves them


def two_of_three_fit():
    return teraio.Session(gpu_budget=2 * ELEMENTS * 4, host_budget=4 * ELEMENTS * 4, device="cpu",
                          warmup_steps=1, profile_steps=1, bandwidths=FAST)


def take_turns(session, a, b, c, after_each=lambda: None):
    """4 steps in which `a` is idle while `b` and `c` take turns: planned steps move `a` out after
    its first use and back before its last, and evict the others reactively."""
    for _ in range(4):
        with session.step():
            for t in (a,) + (b, c) * 40 + (a,):
                t.sum()
                after_each()


def test_moved_storages_keep_only_the_programs_references():
    # Two of three storages fit. `a` is idle while the others take turns, so planned steps move
    # it out after its first use and back before its last, with the transfers in flight across
    # operators; the other storages are evicted reactively.
    a, b, c = (torch.randn(ELEMENTS) for _ in range(3))
    seen = []
    with two_of_three_fit() as session:
        take_turns(session, a, b, c, lambda: seen.append([_native._storage_references(x) for x in (a, b, c)]))
        steps = session.report()["steps"]
    assert all(s["planned_offloads"] > 0 and s["evictions"] > 0 for s in steps[2:])
    assert all(refs == [1, 1, 1] for refs in seen), seen


def test_settled_transfers_give_every_storage_its_memory_back():
    # While a transfer is in flight TeraIO holds the memory and the storage points at it through
    # an alias. The session looks for settled transfers only when one settled or memory was
    # taken; a transfer that settles after the last step must still give its memory back at the
    # next operator on a tracked storage.
    a, b, c = (torch.randn(ELEMENTS) for _ in range(3))
    with two_of_three_fit() as session:
        take_turns(session, a, b, c)
        in_flight = ("offloading", "fetching")
        deadline = time.monotonic() + 10
        while any(session.locations().get(where, (0, 0))[0] for where in in_flight):
            assert time.monotonic() < deadline, session.locations()
            time.sleep(0.01)
        for t in (a, b, c):
            t.sum()  # between steps: fetched if offloaded, and settled memory handed back
        assert all(_native._storage_owns_memory(t) for t in (a, b, c)), session.locations()
