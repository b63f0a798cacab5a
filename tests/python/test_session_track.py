"""Session.track(): tensors that exist before a session's first step (a resumed optimizer's
state) are tracked up front, so that the warm-up's reactive eviction counts them before any
operator touches them; training stays bit for bit the same."""
import pytest
import torch

import teraio
from teraio.models import GPT, GPTConfig, make_batch

CONFIG = GPTConfig(vocab=64, d_model=64, layers=4, heads=2, seq=16, batch=4, tie_weights=False)
FAST = {key: 1e12 for key in ("d2h", "h2d", "ssd_read", "ssd_write")}


def _trainer():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    generator = torch.Generator().manual_seed(5)
    losses = []

    def step():
        tokens, targets = make_batch(generator, CONFIG.batch, CONFIG.seq, CONFIG.vocab)
        loss = model(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach().clone())

    return model, optimizer, step, losses


def _large(tensors):
    return [t for t in tensors if t.numel() * t.element_size() >= 4096]  # min_tensor_bytes


def test_resumed_optimizer_state_is_tracked_before_the_first_step_and_training_stays_exact(tmp_path):
    want_model, _, want_step, want_losses = _trainer()
    for _ in range(6):
        want_step()
    model, optimizer, step, losses = _trainer()
    step()  # the optimizer state exists before the session, as after resuming from a checkpoint
    states = _large([t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)])
    params = _large(list(model.parameters()))
    expected = sum(t.numel() * t.element_size() for t in states + params)
    with teraio.Session(gpu_budget=expected // 2, ssd=[tmp_path], ssd_capacity="64MiB", device="cpu",
                        warmup_steps=1, profile_steps=1, bandwidths=FAST) as session:
        assert session.track(model, optimizer) == expected
        assert session.track(model) == 0  # already tracked
        assert session.locations()["device"] == (len(states) + len(params), expected)
        for _ in range(5):
            with session.step():
                step()
        steps = session.report()["steps"]
        assert steps[0]["phase"] == "warmup" and steps[0]["evictions"] > 0
        assert steps[-1]["phase"] == "planned" and steps[-1]["bytes_offloaded"] > 0
    assert all(torch.equal(w, g) for w, g in zip(want_losses, losses))
    assert all(torch.equal(w, g) for w, g in zip(want_model.parameters(), model.parameters()))


def test_track_is_refused_after_the_warmup_and_without_tensors():
    model, optimizer, step, _ = _trainer()
    session = teraio.Session(gpu_budget="1GiB", device="cpu", warmup_steps=1, profile_steps=2)
    with pytest.raises(ValueError, match="no tensors"):
        session.track(object())
    with session.step():
        step()
    with pytest.raises(teraio.Error, match="before the session's first steps") as failure:
        session.track(model, optimizer)
    assert failure.value.kind == "invalid argument"
    session.close()
