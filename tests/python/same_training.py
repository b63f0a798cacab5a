"""What the training tests share: the exactness check (two runs' losses, parameters and optimizer
state equal bit for bit), the reference run, and a model's footprint under a session. A run is
an object with `step()`, `losses` (a list of loss tensors) and `state()` (lists of parameter
tensors and of optimizer state tensors); `make` builds a fresh one."""
import contextlib

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


class AutocastTrainer:
    """A run of `make_model()` (built from seed 0): two micro-batches of `draw(generator)` per step,
    the forward under CPU bf16 autocast (or in fp32, without `autocast`), AdamW. `step(around)`
    enters `around()` for each forward."""

    def __init__(self, make_model, draw, autocast=True):
        self.autocast = autocast
        torch.manual_seed(0)
        self.model = make_model()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2, foreach=False)
        self.generator = torch.Generator().manual_seed(5)
        self.draw = lambda: draw(self.generator)
        self.losses = []

    def step(self, around=None):
        tokens, targets = self.draw()
        for _ in range(2):  # two micro-batches: gradients accumulate
            with around() if around else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                    loss = self.model(tokens, targets)
            loss.backward()
            self.losses.append(loss.detach().clone())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state(self):
        return ([p.detach().clone() for p in self.model.parameters()],
                [t.detach().clone() for s in self.optimizer.state.values() for t in s.values()])


def graph_nodes(root):
    """Every autograd node `root` reaches, each once."""
    stack, seen = [root], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
        yield fn
