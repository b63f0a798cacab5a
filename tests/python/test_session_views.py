"""Operators that only make views (transposes, slices, unsqueezes, ...) touch no bytes: the
session lets them pass without counting them. They are not in the trace, they fetch nothing,
and a view of a tensor that is away reads the right bytes once an operator needs them."""
from __future__ import annotations

import json

import torch

import teraio

ELEMENTS = 4096  # 16 KiB fp32 storages: above the session's min_tensor_bytes


def test_views_are_not_in_the_trace(tmp_path):
    x = torch.randn(64, 64)

    def step():
        a = x * 2
        v = a.t().unsqueeze(0).transpose(1, 2)[0, 1:]  # views of a: no operator counted
        b = v * 3
        return b.view(-1).narrow(0, 1, 8) + 1

    with teraio.Session(gpu_budget=0, device="cpu", warmup_steps=1, profile_steps=1) as session:
        for _ in range(2):
            with session.step():
                step()
        session.save_trace(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert [op["name"] for op in trace["ops"]] == ["aten::mul", "aten::mul", "aten::add"]
    made_by = {tensor["uses"][0]: tensor for tensor in trace["tensors"] if not tensor["persistent"]}
    assert made_by[0]["uses"] == [0, 1]  # a: made, then read through its view by the second mul


def run(take_views):
    """Three storages take turns and two fit, so each sum evicts the one used least recently
    (plan_filter drops every migration: reactive eviction alone). After the sums, views of all
    three, then a read through the first one's."""
    torch.manual_seed(0)
    a, b, c = (torch.randn(ELEMENTS) for _ in range(3))
    sums = []
    with teraio.Session(gpu_budget=2 * ELEMENTS * 4, host_budget=4 * ELEMENTS * 4, device="cpu",
                        warmup_steps=1, profile_steps=1, plan_filter=lambda migrations: []) as session:
        for _ in range(4):
            with session.step():
                for t in (a, b, c):
                    t.mul(2)
                if take_views:
                    views = [t.view(64, 64).t()[1:].unsqueeze(0) for t in (a, b, c)]
                    sums.append(views[0].mul(3).sum().item())
                else:
                    sums.append(a.view(64, 64).mul(3).sum().item())
        steps = session.report()["steps"]
    return [s["demand_fetches"] for s in steps], sums


def test_a_view_of_a_tensor_that_is_away_fetches_nothing_and_reads_its_bytes():
    with_views, sums_with_views = run(take_views=True)
    without, _ = run(take_views=False)
    # The views of b and c, both away or about to be, cost no fetch: only the read of a does.
    assert with_views == without, (with_views, without)
    assert sum(with_views) > 0  # the turns do evict, so the views did meet tensors away
    torch.manual_seed(0)
    a = torch.randn(ELEMENTS)
    expected = a.view(64, 64).t()[1:].unsqueeze(0).mul(3).sum().item()
    assert sums_with_views == [expected] * 4


def trace_names(tmp_path, step):
    with teraio.Session(gpu_budget=0, device="cpu", warmup_steps=1, profile_steps=1) as session:
        for _ in range(2):
            with session.step():
                step()
        session.save_trace(tmp_path / "trace.json")
    return [op["name"] for op in json.loads((tmp_path / "trace.json").read_text())["ops"]]


def test_narrow_with_a_tensor_start_is_counted(tmp_path):
    # narrow.Tensor reads its start (an item() inside it): not a view operator only.
    x = torch.randn(64, 64)
    start = torch.tensor(3)
    assert trace_names(tmp_path, lambda: x.narrow(0, start, 8).mul(2)) == ["aten::narrow", "aten::mul"]
    assert trace_names(tmp_path, lambda: x.narrow(0, 3, 8).mul(2)) == ["aten::mul"]


def test_views_are_counted_under_a_python_dispatch_mode(tmp_path):
    # Python runs inside every operator under a dispatch mode, and may read the bytes.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(64, 64)

    def step():
        with Passthrough():
            x.t().mul(2)

    assert trace_names(tmp_path, step)[:2] == ["aten::t", "aten::mul"]
