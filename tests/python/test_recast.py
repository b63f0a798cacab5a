"""teraio.recast: the cast copies of weights are kept as recipes in the forward pass and made again
in the backward pass, with gradients, losses and optimizer state bit for bit those of the same
training without it, under a session too; less memory stays alive from forward to backward."""
import contextlib

import pytest
import torch

import teraio
from same_training import AutocastTrainer, assert_same_training, footprint, graph_nodes, reference
from teraio import recast
from teraio.models import GPT, GPTConfig, make_batch

CONFIG = GPTConfig(vocab=64, d_model=64, layers=3, heads=2, seq=16, batch=4, tie_weights=True)
FAST = {key: 1e12 for key in ("d2h", "h2d", "ssd_read", "ssd_write")}


def Trainer():
    return AutocastTrainer(lambda: GPT(CONFIG), lambda g: make_batch(g, CONFIG.batch, CONFIG.seq, CONFIG.vocab))


def test_recast_training_is_exact_and_counts_what_it_did():
    counts = recast.Recasts()
    got = Trainer()
    for _ in range(3):
        got.step(lambda: recast.weights(counts))
    assert_same_training(reference(Trainer, 3), got)
    # Every Linear's weight (and the tied head) is cast once per micro-batch and kept as a recipe.
    linears = sum(isinstance(m, torch.nn.Linear) for m in got.model.modules())
    assert counts.kept_as_recipe >= 6 * linears and counts.recast == counts.kept_as_recipe
    assert counts.bytes_not_kept > 0 and "cast again in backward" in counts.describe()


def _saved_weights_after_forward(around):
    """For every matrix product in the graph of one forward pass, whether autograd holds its
    weight operand (the same storage each time it is read back) or makes it anew on each read."""
    trainer = Trainer()
    tokens, targets = trainer.draw()
    with around() if around else contextlib.nullcontext():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = trainer.model(tokens, targets)
    held, made = 0, 0
    for fn in graph_nodes(loss.grad_fn):
        if hasattr(fn, "_saved_mat2"):
            first, second = fn._saved_mat2, fn._saved_mat2  # both alive: a fresh copy has its own storage
            if first.dtype == torch.bfloat16 and first.dim() == 2:
                held += first.data_ptr() == second.data_ptr()
                made += first.data_ptr() != second.data_ptr()
    loss.backward()
    return held, made


def test_the_weight_copies_are_made_again_not_kept():
    held, made = _saved_weights_after_forward(None)
    assert held > 0 and made == 0
    held_with_recast, made_with_recast = _saved_weights_after_forward(recast.weights)
    assert held_with_recast == 0 and made_with_recast == held
    assert torch.is_autocast_cache_enabled()  # put back on leaving


def test_a_parameter_changed_before_backward_is_refused():
    trainer = Trainer()
    tokens, targets = trainer.draw()
    with recast.weights():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = trainer.model(tokens, targets)
    with torch.no_grad():
        trainer.model.blocks[0].fc.weight.add_(1.0)
    # Autograd passes a hook's exception on as a RuntimeError with its text.
    with pytest.raises(RuntimeError, match="modified in place between the forward and the backward"):
        loss.backward()


def test_fp32_training_keeps_everything_as_it_was():
    counts = recast.Recasts()
    trainer = Trainer()
    tokens, targets = trainer.draw()
    with recast.weights(counts):
        loss = trainer.model(tokens, targets)
    loss.backward()
    assert counts.kept_as_recipe == 0 and counts.recast == 0



def test_a_session_with_recast_weights_stays_exact(tmp_path):
    want = reference(Trainer, 5)
    got = Trainer()
    with teraio.Session(gpu_budget=footprint(Trainer) // 2, ssd=[tmp_path], ssd_capacity="64MiB", device="cpu", warmup_steps=1,
                        profile_steps=1, bandwidths=FAST, recast_weights=True) as session:
        for _ in range(5):
            with session.step():
                got.step()
        assert session.recasts.recast > 0 and session.recasts.recast == session.recasts.kept_as_recipe
        steps = session.report()["steps"]
        assert steps[-1]["phase"] == "planned" and not any(s["diverged"] for s in steps)
        assert sum(s["bytes_offloaded"] for s in steps[-2:]) > 0
    assert_same_training(want, got)
    assert teraio.Session(gpu_budget=None, device="cpu").recasts is None


def test_an_activation_changed_in_place_before_backward_is_still_refused():
    """A saved-tensor hook turns off autograd's own version check; recast keeps it."""
    x = torch.randn(4, requires_grad=True)
    with recast.weights():
        y = x.sigmoid()  # saves its output
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


def test_a_graph_dropped_without_backward_is_freed():
    """No reference cycle through a saved output's grad_fn: the graph goes with its last reference."""
    import gc
    import weakref

    x = torch.randn(256, requires_grad=True)
    with recast.weights():
        y = x.sigmoid().exp()
    out = weakref.ref(y)
    del y
    gc.collect()
    assert out() is None


def test_a_copy_changed_after_the_cast_is_kept_as_it_is():
    counts = recast.Recasts()
    w = torch.nn.Parameter(torch.randn(3, 3))
    x = torch.randn(2, 3, dtype=torch.float64)
    with recast.weights(counts):
        copy = w.to(torch.float64)
        with torch.no_grad():
            copy.mul_(3)
        y = x @ copy
    y.sum().backward()
    assert counts.kept_as_recipe == 0
    assert torch.equal(w.grad, (x.t() @ torch.ones(2, 3, dtype=torch.float64)).float())

