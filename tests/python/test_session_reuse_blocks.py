"""Session(reuse_blocks=True): the block of a tensor moved out is kept, inside the budget, for a
later fetch of its size, instead of the allocator freeing one and finding another. Here every
eviction is at the budget's edge, so a block is either taken by the fetch that needed the room
or goes back at once (blocks kept across calls: test_training_exact.py). The training stays
exact, the step record counts the reused blocks, and blocks of another size are not reused."""
from __future__ import annotations

import torch

import teraio
from conftest import requires_cuda

ELEMENTS = 4096  # 16 KiB fp32 storages: above the session's min_tensor_bytes


def run(reuse, sizes=(ELEMENTS, ELEMENTS, ELEMENTS), device="cpu", allocated=None):
    """Three storages take turns, and an operator's input and output just fit the budget, so each
    use of one that is away evicts others (a storage, or the product before it) and fetches it
    in the same call (plan_filter drops every migration: reactive eviction alone). Returns the
    step records and the sum of every product. On CUDA, `allocated` gets the caching
    allocator's allocated bytes after each product."""
    torch.manual_seed(0)
    tensors = [torch.randn(n).to(device) for n in sizes]
    budget = 2 * max(sizes) * 4
    products = []
    with teraio.Session(gpu_budget=budget, host_budget=4 * sum(sizes) * 4, device=device, warmup_steps=1,
                        profile_steps=1, plan_filter=lambda migrations: [], reuse_blocks=reuse) as session:
        for _ in range(4):
            with session.step():
                product = None
                for t in tensors:
                    # The previous product lives on while this one is made: fetching t needs room.
                    product = t.mul(2)
                    if allocated is not None:
                        allocated.append(torch.cuda.memory_allocated(device))
                    products.append(product.sum().item())
        steps = session.report()["steps"]
    return steps, products


def test_a_fetch_reuses_the_block_an_eviction_freed_and_stays_exact(device):
    reused_steps, reused = run(reuse=True, device=device)
    plain_steps, plain = run(reuse=False, device=device)
    torch.manual_seed(0)
    expected = [t.to(device).mul(2).sum().item() for t in [torch.randn(ELEMENTS) for _ in range(3)]] * 4
    assert reused == expected and plain == expected
    fetches = [s["demand_fetches"] for s in reused_steps]
    assert [s["demand_fetches"] for s in plain_steps] == fetches
    assert sum(fetches) > 0
    # Every demand fetch of a planned step evicted a tensor of its size in the same call and took
    # its block. (Before session 34 a step's first fetch found room: the step before had evicted
    # for a phantom output at its last operator, test_session_births.py.) An earlier step's first
    # fetch may find room the step before left.
    planned = [s for s in reused_steps if s["phase"] == "planned"]
    assert planned and all(s["blocks_reused"] == s["demand_fetches"] > 0 for s in planned), reused_steps
    assert all(s["blocks_reused"] <= s["demand_fetches"] for s in reused_steps), reused_steps
    assert all(s["blocks_reused"] == 0 for s in plain_steps)


def test_a_block_of_another_size_is_not_reused():
    steps, products = run(reuse=True, sizes=(ELEMENTS, 2 * ELEMENTS, 3 * ELEMENTS))
    torch.manual_seed(0)
    tensors = [torch.randn(n) for n in (ELEMENTS, 2 * ELEMENTS, 3 * ELEMENTS)]
    assert products == [t.mul(2).sum().item() for t in tensors] * 4
    assert sum(s["demand_fetches"] for s in steps) > 0
    assert all(s["blocks_reused"] == 0 for s in steps), steps


@requires_cuda
def test_on_cuda_a_reused_block_is_back_with_the_allocator_between_operators():
    """A block over the budget goes back at once, and a reused block counts once: between
    operators the caching allocator holds the same bytes with reuse as without."""
    reused_allocated, plain_allocated = [], []
    reused_steps, _ = run(reuse=True, device="cuda", allocated=reused_allocated)
    run(reuse=False, device="cuda", allocated=plain_allocated)
    assert sum(s["blocks_reused"] for s in reused_steps) > 0
    assert reused_allocated == plain_allocated
