"""Session(record_releases=True): the profile records when the program actually frees each
storage, not only when it last uses it. A storage a Python variable holds until the next loop
iteration keeps its memory that long; a plan that counts it as free at its last use
(record_releases=False, the default until session 36) leaves the planned steps over the budget, and reactive eviction
and demand fetches make up the difference in every step."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import teraio
from teraio.models import GPT, GPTConfig

ELEMENTS = 4096  # 16 KiB fp32 storages: above the session's min_tensor_bytes


@pytest.mark.parametrize("record_releases", [True, False])
def test_the_trace_holds_a_storage_until_the_program_frees_it(tmp_path, record_releases):
    x = torch.randn(ELEMENTS)

    def step():
        a = x * 2  # operator 0 makes a
        b = a + 1  # operator 1 is its last use
        c = b * 3
        d = c - 1
        del a  # freed before operator 4: held through operator 3, two past its last use
        return d * 2

    with teraio.Session(gpu_budget=0, device="cpu", warmup_steps=1, profile_steps=1,
                        record_releases=record_releases) as session:
        for _ in range(2):
            with session.step():
                step()
        session.save_trace(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert [op["name"] for op in trace["ops"]] == ["aten::mul", "aten::add", "aten::mul", "aten::sub", "aten::mul"]
    made_by = {tensor["uses"][0]: tensor for tensor in trace["tensors"] if not tensor["persistent"]}
    if not record_releases:
        assert all("held_after_use" not in tensor for tensor in trace["tensors"])
        return
    assert made_by[0]["uses"] == [0, 1] and made_by[0]["held_after_use"] == 2
    # b, c and d live until step() returns, after the last operator: held to its end.
    assert made_by[1]["uses"] == [1, 2] and made_by[1]["held_after_use"] == 2
    assert made_by[3]["uses"] == [3, 4] and made_by[3].get("held_after_use", 0) == 0


def accumulation_loop(record_releases):
    """Six steps of a gradient-accumulation loop under half its model states; the step records.
    AdamW with foreach=False keeps each parameter's `denom` in a variable until the next
    parameter's replaces it; the micro-batch loop keeps `loss` and the batch the same way."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=256, d_model=128, layers=2, heads=4, seq=32, batch=2, tie_weights=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    states = sum(p.numel() for p in model.parameters()) * 16
    generator = torch.Generator().manual_seed(1)
    records = []
    with teraio.Session(gpu_budget=states // 2, host_budget=2 * states, device="cpu",
                        record_releases=record_releases) as session:
        for _ in range(6):
            with session.step():
                for _ in range(4):
                    tokens = torch.randint(0, 256, (2, 33), generator=generator)
                    loss = model(tokens[:, :-1], tokens[:, 1:])
                    (loss / 4).backward()
                optimizer.step()
                model.zero_grad(set_to_none=True)
            records.append(session.last_step)
    return records, states


@pytest.mark.parametrize("record_releases", [True, False])
def test_planned_steps_of_a_gradient_accumulation_loop_need_no_reactive_eviction(record_releases):
    records, states = accumulation_loop(record_releases)
    planned = [r for r in records if r["phase"] == "planned"]
    assert len(planned) == 3 and all(r["planned_offloads"] > 0 for r in planned)
    if not record_releases:
        # The held storages push the step over its budget, and reactive eviction keeps it: the
        # evictions of the steady state are all for those late frees.
        assert all(r["evictions"] > 0 and r["peak_resident"] <= states // 2 for r in planned)
        assert all(r["late_free_evictions"] == r["evictions"] for r in planned), planned
        return
    # The first planned step starts from the profile's placement, not the plan's: from the
    # second on, the plan alone keeps the budget. It moves some held storages out for good.
    assert [(r["evictions"], r["demand_fetches"]) for r in planned[1:]] == [(0, 0), (0, 0)]
    assert all(r["late_free_evictions"] == 0 for r in planned)
    assert all(r["planned_offloads"] > r["planned_prefetches"] for r in planned[1:])


def test_a_planned_step_evicts_the_storage_used_furthest_ahead():
    # Three storages take turns, two fit. With no migration planned (the filter drops them all)
    # reactive eviction alone holds the budget. Least recently used evicts the one used next
    # every time, so every use would be a demand fetch (6 per step); the storage used furthest
    # ahead (the executor's rule in planned steps, from the profiled trace) misses far less.
    a, b, c = (torch.randn(ELEMENTS) for _ in range(3))
    with teraio.Session(gpu_budget=2 * ELEMENTS * 4, host_budget=4 * ELEMENTS * 4, device="cpu",
                        warmup_steps=1, profile_steps=1, plan_filter=lambda migrations: []) as session:
        for _ in range(5):
            with session.step():
                for t in (a, b, c, a, b, c):
                    t.sum()  # a 4-byte result: not tracked
        planned = [s for s in session.report()["steps"] if s["phase"] == "planned"]
    assert len(planned) == 3 and all(s["mode"] == "planned" for s in planned)
    fetches = [s["demand_fetches"] for s in planned]
    assert max(fetches) <= 3, fetches  # least recently used: 6


@pytest.mark.parametrize("record_releases", [True, False])
def test_a_session_says_once_at_info_level_when_late_frees_cost_evictions(record_releases):
    # The log level is read once per process (TERAIO_LOG_LEVEL): the loop runs in a child.
    package_root = str(pathlib.Path(teraio.__file__).resolve().parents[1])
    env = {**os.environ, "TERAIO_LOG_LEVEL": "info",
           "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, __file__, str(record_releases)], capture_output=True, text=True,
                           env=env, timeout=300)
    assert child.returncode == 0, child.stderr
    said = [line for line in child.stderr.splitlines() if "holds past their last use" in line]
    if record_releases:
        assert said == [], said
        return
    assert len(said) == 1, child.stderr
    assert "evictions are for storages the program holds past their last use" in said[0]
    assert "Session(record_releases=True)" in said[0]


if __name__ == "__main__":
    accumulation_loop(sys.argv[1] == "True")
