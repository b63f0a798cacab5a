"""teraio.recast: the cast copies of weights are kept as recipes in the forward pass and made again
in the backward pass, with gradients, losses and optimizer state bit for bit those of the same
training without it, under a session too; less memory stays alive from forward to backward."""
import pytest
import torch

import teraio
from teraio import recast
from teraio.models import GPT, GPTConfig, make_batch

CONFIG = GPTConfig(vocab=64, d_model=64, layers=3, heads=2, seq=16, batch=4, tie_weights=True)
FAST = {key: 1e12 for key in ("d2h", "h2d", "ssd_read", "ssd_write")}


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = GPT(CONFIG)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2, foreach=False)
        self.generator = torch.Generator().manual_seed(5)
        self.losses = []

    def step(self, around=None):
        tokens, targets = make_batch(self.generator, CONFIG.batch, CONFIG.seq, CONFIG.vocab)
        for _ in range(2):  # two micro-batches: gradients accumulate
            with around() if around else _nothing():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = self.model(tokens, targets)
            loss.backward()
            self.losses.append(loss.detach().clone())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state(self):
        return ([p.detach().clone() for p in self.model.parameters()],
                [t.detach().clone() for s in self.optimizer.state.values() for t in s.values()])


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _assert_same(want, got):
    assert len(got.losses) == len(want.losses)
    for i, (w, g) in enumerate(zip(want.losses, got.losses)):
        assert torch.equal(w, g), f"loss {i}: {g.item()!r} against {w.item()!r}"
    for kind, ws, gs in zip(("parameter", "optimizer state"), want.state(), got.state()):
        for i, (w, g) in enumerate(zip(ws, gs)):
            assert torch.equal(w, g), f"{kind} {i} differs"


def _reference(steps):
    trainer = Trainer()
    for _ in range(steps):
        trainer.step()
    return trainer


def test_recast_training_is_exact_and_counts_what_it_did():
    counts = recast.Recasts()
    got = Trainer()
    for _ in range(3):
        got.step(lambda: recast.weights(counts))
    _assert_same(_reference(3), got)
    # Every Linear's weight (and the tied head) is cast once per micro-batch and kept as a recipe.
    linears = sum(isinstance(m, torch.nn.Linear) for m in got.model.modules())
    assert counts.kept_as_recipe >= 6 * linears and counts.recast == counts.kept_as_recipe
    assert counts.bytes_not_kept > 0 and "cast again in backward" in counts.describe()


def _weight_copies_alive_after_forward(around):
    """How many bf16 copies of parameters are still alive once the forward pass and its autocast
    region are over (autograd keeps them for backward unless they were kept as recipes)."""
    import weakref
    from torch.utils._python_dispatch import TorchDispatchMode

    trainer = Trainer()
    copies = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == "_to_copy" and out.dtype == torch.bfloat16:
                copies.append(weakref.ref(out))
            return out

    tokens, targets = make_batch(trainer.generator, CONFIG.batch, CONFIG.seq, CONFIG.vocab)
    with around() if around else _nothing():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with Watch():
                loss = trainer.model(tokens, targets)
    alive = sum(ref() is not None for ref in copies)
    loss.backward()
    return alive, len(copies)


def test_the_copies_are_not_alive_between_forward_and_backward():
    kept, made = _weight_copies_alive_after_forward(None)
    assert made > 0 and kept > 0
    kept_with_recast, made_with_recast = _weight_copies_alive_after_forward(recast.weights)
    assert made_with_recast == made
    # Only activation casts (not parameters) may still be alive.
    linears = sum(isinstance(m, torch.nn.Linear) for m in Trainer().model.modules())
    assert kept - kept_with_recast >= linears, (kept, kept_with_recast, linears)
    assert torch.is_autocast_cache_enabled()  # put back on leaving


def test_a_parameter_changed_before_backward_is_refused():
    trainer = Trainer()
    tokens, targets = make_batch(trainer.generator, CONFIG.batch, CONFIG.seq, CONFIG.vocab)
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
    tokens, targets = make_batch(trainer.generator, CONFIG.batch, CONFIG.seq, CONFIG.vocab)
    with recast.weights(counts):
        loss = trainer.model(tokens, targets)
    loss.backward()
    assert counts.kept_as_recipe == 0 and counts.recast == 0


def _footprint():
    trainer = Trainer()
    with teraio.Session(gpu_budget=None, device="cpu", warmup_steps=1, profile_steps=1) as session:
        for _ in range(2):
            with session.step():
                trainer.step()
        return session.report()["footprint_bytes"]


def test_a_session_with_recast_weights_stays_exact(tmp_path):
    want = _reference(5)
    got = Trainer()
    with teraio.Session(gpu_budget=_footprint() // 2, ssd=[tmp_path], ssd_capacity="64MiB", device="cpu", warmup_steps=1,
                        profile_steps=1, bandwidths=FAST, recast_weights=True) as session:
        for _ in range(5):
            with session.step():
                got.step()
        assert session.recasts.recast > 0 and session.recasts.recast == session.recasts.kept_as_recipe
        steps = session.report()["steps"]
        assert steps[-1]["phase"] == "planned" and not any(s["diverged"] for s in steps)
        assert sum(s["bytes_offloaded"] for s in steps[-2:]) > 0
    _assert_same(want, got)
    assert teraio.Session(gpu_budget=None, device="cpu").recasts is None
