"""The session counts, per step, the operators that make the host wait for the device (reads of
a device scalar, nonzero, blocking copies between the device and the host): under TeraIO each
costs GPU time while the host launches again through its callbacks (W3: ~40 ms a micro-batch,
bench/RESULTS.md session 39). On a CPU session the reads and nonzero count as they would on a
GPU when the test asks for it (`_count_cpu_host_syncs`): a CPU session counts none by itself,
since there every tensor is on "the device" and reads of host scalars (an optimizer's step count)
would count."""
from __future__ import annotations

import pytest
import torch

import teraio


def steps_with(body, count=True):
    """Warm-up, profile and planned steps of `body` beside work that does not fit the budget (a
    session with nothing to move goes passive after profiling and observes nothing)."""
    x = torch.randn(64, 64)  # 16 KiB
    with teraio.Session(gpu_budget=5 * 16384, host_budget=1 << 20, device="cpu", warmup_steps=1,
                        profile_steps=1, _count_cpu_host_syncs=count) as session:
        for _ in range(3):
            with session.step():
                kept = [x * 2]
                for k in range(5):
                    kept.append(kept[-1] * (k + 3))  # six 16 KiB tensors alive at once
                sum(kept).sum()
                body(x)
        body(x)  # between steps: not counted
        steps = session.report()["steps"]
    assert [s["phase"] for s in steps] == ["warmup", "profile", "planned"]
    return steps


def test_a_step_without_syncs_counts_none():
    steps = steps_with(lambda x: (x * 2).sum())
    assert [s["host_syncs"] for s in steps] == [0, 0, 0]
    assert [s["first_host_sync"] for s in steps] == ["", "", ""]


def test_item_and_a_tensor_condition_count_once_each():
    def body(x):
        loss = (x * 2).sum()
        loss.item()  # aten::item, then aten::_local_scalar_dense inside it: one sync
        if (x > 0).any():  # bool() of a tensor: aten::is_nonzero, item, _local_scalar_dense
            pass

    steps = steps_with(body)
    assert [s["host_syncs"] for s in steps] == [2, 2, 2]
    assert all(s["first_host_sync"].startswith("a read of a device scalar (aten::_local_scalar_dense) near operator ")
               for s in steps)


def test_nonzero_and_reads_inside_other_operators_count():
    def body(x):
        torch.nonzero(x > 0)
        x.masked_select(x > 1)  # on the CPU: a sum of the mask read with .item() inside
        x[x > 2]  # boolean indexing: nonzero inside

    steps = steps_with(body)
    assert [s["host_syncs"] for s in steps] == [3, 3, 3]
    assert steps[0]["first_host_sync"].startswith("aten::nonzero near operator ")


def test_a_cpu_session_counts_none_by_itself():
    steps = steps_with(lambda x: (x.sum().item(), torch.nonzero(x)), count=False)
    assert [s["host_syncs"] for s in steps] == [0, 0, 0]


def test_copies_on_a_cpu_session_are_no_syncs():
    steps = steps_with(lambda x: (x.to("cpu", copy=True), x.clone().copy_(x)))
    assert [s["host_syncs"] for s in steps] == [0, 0, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_reads_and_blocking_copies_count_and_pinned_non_blocking_copies_do_not():
    device = torch.device("cuda")
    x = torch.randn(64, 64, device=device)
    pageable, pinned = torch.ones(1024), torch.ones(1024).pin_memory()
    step_count = torch.tensor(3.0)  # a host scalar, as an optimizer keeps its step count

    with teraio.Session(gpu_budget=5 * 16384, host_budget=1 << 20, device="cuda", warmup_steps=1,
                        profile_steps=1) as session:
        for _ in range(3):
            with session.step():
                kept = [x * 2]
                for k in range(5):
                    kept.append(kept[-1] * (k + 3))
                sum(kept).sum().item()  # 1: a read of a device scalar
                x.cpu()  # 2: a blocking copy to the host
                pageable.to(device)  # 3: a blocking copy from pageable memory
                x.t().cpu()  # 4: non-contiguous, a second copy_ inside the first: one wait
                pinned.to(device, non_blocking=True)  # not counted
                step_count.item()  # a host scalar: not counted
        steps = session.report()["steps"]
    assert [s["phase"] for s in steps] == ["warmup", "profile", "planned"]
    assert [s["host_syncs"] for s in steps] == [4, 4, 4]
