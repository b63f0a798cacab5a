"""Copies kept in the tier while a tensor is only read (plan::Migration::kept_copy): between
micro-batches a weight is read, never written, so after its first trip out and back its tier
copy stays valid and moving it out again drops its device memory instead of copying it.

Whether the planner keeps a copy depends on the profiled operator times, so the tests of the
runtime and the binding do not rely on it: a plan filter marks every migration kept_copy. The
runtime then keeps a copy after every fetch and drops to it unless the binding reported a
write in between, so the training stays bit-exact only if every write is seen (the schema's
alias annotations, writes the profiled steps never had included).
"""
from __future__ import annotations

import contextlib

import torch

import teraio
from teraio.models import GPT, GPTConfig
from test_training_exact import (STEPS, adamw, assert_exact, batches, budget_kwargs, check_case, footprint,
                                 planned_steps, snapshot_optimizer, snapshot_params, Run)

ACCUMULATE = 4
# Weights outweigh a micro-batch's activations (one short sequence), so under the budget below
# weights or gradients must leave between their uses in every micro-batch.
WIDE = GPTConfig(vocab=256, d_model=128, layers=2, heads=2, seq=8, batch=1, tie_weights=False)
BUDGET_FRACTION = 0.3


def gpt() -> torch.nn.Module:
    return GPT(WIDE)


def kwargs(device, swap_dir, **overrides):
    budget = int(BUDGET_FRACTION * footprint(gpt, adamw, device, ACCUMULATE))
    return budget_kwargs(gpt, adamw, device, swap_dir, ACCUMULATE, gpu_budget=budget, **overrides)


def keep_every_copy(migrations):
    return [dict(m, kept_copy=True) for m in migrations]


def dropped(run: Run) -> int:
    return sum(s["bytes_dropped"] for s in planned_steps(run))


def test_every_copy_kept_stays_exact_and_drops_unchanged_tensors(device, swap_dir):
    run = check_case(gpt, adamw, device, swap_dir, accumulate=ACCUMULATE, plan_filter=keep_every_copy,
                     **{k: v for k, v in kwargs(device, swap_dir).items() if k == "gpu_budget"})
    assert dropped(run) > 0, [s["bytes_dropped"] for s in planned_steps(run)]


def test_the_planners_kept_copies_stay_exact(device, swap_dir):
    run = check_case(gpt, adamw, device, swap_dir, accumulate=ACCUMULATE, keep_copies=True,
                     gpu_budget=kwargs(device, swap_dir)["gpu_budget"])
    # The plan's own choice: drops happen exactly when it planned some.
    assert (run.report["plan"]["bytes_dropped"] > 0) == (dropped(run) > 0), run.report["plan"]


def test_copies_are_kept_only_when_asked(device, swap_dir):
    run = check_case(gpt, adamw, device, swap_dir, accumulate=ACCUMULATE,
                     gpu_budget=kwargs(device, swap_dir)["gpu_budget"])
    assert run.report["plan"]["bytes_dropped"] == 0, run.report["plan"]
    assert dropped(run) == 0


def train(device, session_kwargs=None, after_micro_batch=None, after_step=None):
    """gpt + AdamW with ACCUMULATE micro-batches per step, under a session when given its
    arguments. after_micro_batch(model, step, i) runs inside the step after micro-batch i;
    after_step(model, session, step) runs between steps."""
    torch.manual_seed(0)
    model = gpt().to(device)
    optimizer = adamw(model.parameters())
    data = batches(model.config, STEPS * ACCUMULATE, 0)
    session = None if session_kwargs is None else teraio.Session(device=device, **session_kwargs)
    losses = []
    try:
        for step in range(STEPS):
            with session.step() if session is not None else contextlib.nullcontext():
                for i, (tokens, targets) in enumerate(data[step * ACCUMULATE:(step + 1) * ACCUMULATE]):
                    loss = model(tokens.to(device), targets.to(device))
                    (loss / ACCUMULATE).backward()
                    losses.append(loss.detach().to("cpu", copy=True))
                    if after_micro_batch is not None:
                        after_micro_batch(model, step, i)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if after_step is not None:
                after_step(model, session, step)
        params, state = snapshot_params(model), snapshot_optimizer(optimizer)
        return Run(losses, params, state, None if session is None else session.report().to_dict())
    finally:
        if session is not None:
            session.close()


def nudge_late(model, step, i):
    """From step 5 on, every weight changes in place after the second micro-batch: a write the
    profiled steps never had."""
    if step >= 5 and i == 1:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-3)


def test_a_write_the_plan_did_not_expect_makes_the_kept_copy_stale(device, swap_dir):
    want = train(device, after_micro_batch=nudge_late)
    got = train(device, kwargs(device, swap_dir, plan_filter=keep_every_copy), after_micro_batch=nudge_late)
    assert_exact(want, got)
    steps = got.report["steps"]
    assert any(s["bytes_dropped"] > 0 for s in steps[:5]), [s["bytes_dropped"] for s in steps]


class NormAndOut(GPT):
    """Writes a schema-based check could miss: BatchNorm's running statistics (not annotated as
    written in every PyTorch), and `out=` of an overload whose in-place sibling of the same
    arity writes nothing (`div.out` after `div.Tensor_mode`)."""

    def __init__(self):
        super().__init__(WIDE)
        self.norm_in = torch.nn.Linear(WIDE.d_model, 2048)
        self.norm = torch.nn.BatchNorm1d(2048)
        self.register_buffer("acc", torch.ones(4096))

    def forward(self, tokens, targets=None):
        torch.div(self.tok.weight, 2.0, rounding_mode="floor")
        loss = super().forward(tokens, targets)
        torch.div(self.acc, 1.5, out=self.acc)
        h = self.norm_in(self.tok(tokens).reshape(-1, WIDE.d_model))
        return loss + 1e-3 * self.norm(h).square().mean() + self.acc.sum()


def norm_and_out() -> torch.nn.Module:
    return NormAndOut()


def test_writes_schemas_leave_out_make_copies_stale(device, swap_dir):
    budget = int(0.5 * footprint(norm_and_out, adamw, device, ACCUMULATE))
    check_case(norm_and_out, adamw, device, swap_dir, accumulate=ACCUMULATE, plan_filter=keep_every_copy,
               gpu_budget=budget)


def test_writes_inside_resident_make_copies_stale(device, swap_dir):
    """resident() is for code that touches storage directly; what it writes must not be undone."""
    def write_directly(model, session, step):
        if step < 4:
            return
        with session.resident(model) if session is not None else contextlib.nullcontext():
            with torch.no_grad():
                for p in model.parameters():
                    # Through numpy's view of the memory on the CPU, which no operator sees; on
                    # CUDA through an in-place operator on an alias (.data).
                    if p.device.type == "cpu":
                        p.detach().numpy()[...] += 1e-3
                    else:
                        p.data.add_(1e-3)

    assert_exact(train(device, after_step=write_directly),
                 train(device, kwargs(device, swap_dir, plan_filter=keep_every_copy), after_step=write_directly))
