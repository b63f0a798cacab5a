"""What the training tests share: the exactness check (two runs' losses, parameters and optimizer
state equal bit for bit), the reference run, and a model's footprint under a session. A run is
an object with `step()`, `losses` (a list of loss tensors) and `state()` (lists of parameter
tensors and of optimizer state tensors); `make` builds a fresh one."""
import torch

import teraio


def assert_same_training(want, got):
    assert len(got.losses) == len(want.losses)
    for i, (w, g) in enumerate(zip(want.losses, got.losses)):
        assert torch.equal(w, g), f"loss {i}: {g.item()!r} against {w.item()!r}"
    for kind, ws, gs in zip(("parameter", "optimizer state"), want.state(), got.state()):
        for i, (w, g) in enumerate(zip(ws, gs)):
            assert torch.equal(w, g), f"{kind} {i} differs"


def reference(make, steps):
    """`steps` steps of a fresh run without TeraIO."""
    run = make()
    for _ in range(steps):
        run.step()
    return run


def footprint(make):
    """The bytes a fresh run's tracked tensors hold, from a session with no budget."""
    run = make()
    with teraio.Session(gpu_budget=None, device="cpu", warmup_steps=1, profile_steps=1) as session:
        for _ in range(2):
            with session.step():
                run.step()
        return session.report()["footprint_bytes"]
