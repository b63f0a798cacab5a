"""The exactness check the training tests share: two runs' losses, parameters and optimizer state
are equal bit for bit. Each run is an object with `losses` (a list of loss tensors) and `state()`
(lists of parameter tensors and of optimizer state tensors)."""
import torch


def assert_same_training(want, got):
    assert len(got.losses) == len(want.losses)
    for i, (w, g) in enumerate(zip(want.losses, got.losses)):
        assert torch.equal(w, g), f"loss {i}: {g.item()!r} against {w.item()!r}"
    for kind, ws, gs in zip(("parameter", "optimizer state"), want.state(), got.state()):
        for i, (w, g) in enumerate(zip(ws, gs)):
            assert torch.equal(w, g), f"{kind} {i} differs"
