"""teraio.recompute: recomputation beside offloading.

Offloading alone cannot hide activations that are made faster than the link carries them away:
W1's forward pass makes about 30 GiB of activations in a tenth of a second, and PCIe moves 55 GB/s.
Recomputing them (activation checkpointing) costs another forward pass of each checkpointed
layer instead. The two combine. The last layers are the ones to checkpoint, because their
activations live the shortest time: they are made at the end of the forward pass and used at
the start of the backward pass, so there is no time to move them out and back. Activations
made earlier live longer, and offloading can hide their transfers. How many layers to
checkpoint depends on the model, the budget and the link, so `tune` measures it: for each
candidate count it profiles, plans and times steps under the session, and keeps the fastest.

Checkpointing here is `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` around a
layer's forward. It recomputes the same operators on the same inputs, so losses are bit for
bit those of the run without it.
"""
from __future__ import annotations

import dataclasses
import sys
import types
from typing import Callable, Optional, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from . import _native
from .session import _error


class Recomputation:
    """Activation checkpointing of the last `count` of `layers` (decoder layers, in order).

    `set(count)` may be called again at any time between steps; `set(0)` puts every layer's own
    forward back.
    """

    def __init__(self, layers: Sequence[torch.nn.Module]):
        self._layers = list(layers)
        if not self._layers:
            raise ValueError("Recomputation: no layers given")
        for index, layer in enumerate(self._layers):
            if not isinstance(layer, torch.nn.Module):
                raise TypeError(f"Recomputation: layer {index} is a {type(layer).__name__}, not a torch.nn.Module")
            if "forward" in vars(layer) and not _is_ours(vars(layer)["forward"]):
                # Someone else replaced this layer's forward: wrapping it again would hide theirs.
                raise ValueError(f"Recomputation: layer {index} ({type(layer).__name__}) already has its forward "
                                 "replaced (is checkpointing enabled another way?)")
        # Layers an earlier Recomputation wrapped: their count, made the last ones.
        self._count = 0
        self.set(sum("forward" in vars(layer) for layer in self._layers))

    @property
    def layers(self) -> int:
        return len(self._layers)

    @property
    def count(self) -> int:
        return self._count

    def set(self, count: int) -> None:
        if not 0 <= count <= len(self._layers):
            raise ValueError(f"Recomputation: count {count} is not between 0 and {len(self._layers)} layers")
        first = len(self._layers) - count
        for index, layer in enumerate(self._layers):
            wrapped = "forward" in vars(layer)
            if index >= first and not wrapped:
                # A method bound to the layer, not a closure over its forward: a deepcopy of
                # the model then checkpoints the copy's own layers.
                layer.forward = types.MethodType(_checkpointed_forward, layer)
            elif index < first and wrapped:
                del layer.forward  # the class's forward again
        self._count = count


def _checkpointed_forward(layer, *args, **kwargs):
    return checkpoint(type(layer).forward, layer, *args, use_reentrant=False, **kwargs)


def _is_ours(forward) -> bool:
    return isinstance(forward, types.MethodType) and forward.__func__ is _checkpointed_forward


@dataclasses.dataclass
class Trial:
    """One candidate count: how its steps ran under the session."""

    count: int                       # layers recomputed (the last ones)
    step_s: Optional[float]          # the fastest measured step; None when the trial failed or timed nothing
    phase: str                       # the session's phase when measured ("planned", "passive"; "profile"
                                     # after two divergent steps), or "failed"
    predicted_step_s: Optional[float]  # the simulator's step for the plan (the profiled step when passive)
    stall_free: Optional[bool]       # a plan fits the budget without planned waits
    bytes_offloaded: int = 0         # per measured step, to host and SSD
    error: Optional[str] = None      # why the trial failed: planning its profiled step failed

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def rank_s(self) -> Optional[float]:
        """What the search compares: the measured step, or the predicted one when none was timed."""
        return self.step_s if self.step_s is not None else self.predicted_step_s

    def describe(self) -> str:
        if self.failed:
            return f"{self.count} recomputed: failed ({self.error})"
        if self.step_s is None:
            predicted = "no prediction" if self.predicted_step_s is None else f"predicted {self.predicted_step_s:.3f} s"
            return f"{self.count} recomputed: {predicted} ({self.phase}, not timed)"
        predicted = f", predicted {self.predicted_step_s:.3f} s" if self.predicted_step_s is not None else ""
        moved = f", {_native.format_bytes(self.bytes_offloaded)} out" if self.bytes_offloaded else ""
        return f"{self.count} recomputed: {self.step_s:.3f} s ({self.phase}{predicted}{moved})"


@dataclasses.dataclass
class Choice:
    count: int            # layers recomputed from now on
    layers: int
    trials: list          # of Trial, in the order run
    steps: int            # training steps tune() ran
    # How the session came back to the chosen count after trying others: "its trial's plan
    # kept" (the chosen trial's plan runs again), "profiled again", or "" (it ran last).
    returned_by: str = ""

    def describe(self) -> str:
        back = f"; {self.returned_by}" if self.returned_by else ""
        return (f"recompute {self.count} of {self.layers} layers (chosen from {len(self.trials)} trials in "
                f"{self.steps} training steps{back}: " + "; ".join(t.describe() for t in self.trials) + ")")


class _PlanFailed(Exception):
    """Planning a trial's profiled step failed; the step itself had completed."""


def _stderr(line: str) -> None:
    print(f"teraio.recompute: {line}", file=sys.stderr, flush=True)


def coarse_counts(layers: int, stride: int) -> list:
    """The counts the coarse scan visits: every layer checkpointed first, then `stride` fewer at a
    time down to none."""
    counts = list(range(layers, -1, -stride))
    if counts[-1] != 0:
        counts.append(0)
    return counts


def tune(session, layers, step: Callable[[], object], counts: Optional[Sequence[int]] = None,
         measure_steps: int = 2, max_trials: int = 9, slower_stop: float = 0.10,
         progress: Optional[Callable[[str], None]] = _stderr,
         on_trial: Optional[Callable[[Trial], None]] = None) -> Choice:
    """Chooses how many of `layers` (the last ones) to recompute under `session`, by measuring.

    `step()` runs one training step's forward, backward and optimizer step; tune() runs it inside
    `session.step()` itself. Every trial sets the count, has the session profile and plan the
    changed step (`session.reprofile()`), then times `measure_steps` planned steps and keeps the
    fastest. `measure_steps=0` times nothing: each trial only profiles and plans, and the search
    compares the simulator's predicted steps instead (a cheaper, less certain choice; the
    benchmark uses it to collect each count's trace for its bound). With `counts` the trials
    are exactly those; otherwise a scan from every layer checkpointed down to none in strides of
    a quarter of the layers, stopped early once a trial is more than `slower_stop` slower than
    the best and slower than the one before it, then refined around the best by halving
    strides, `max_trials` in all.

    The fastest trial's plan is kept (`session.keep_plan()`); when the search ends on another
    count, the session goes back to the chosen one with that plan (`session.use_plan()`), so the
    steps after tune() run the plan that was timed, and no step is spent profiling again. Two
    profiles of the same step can give plans that run differently: on W2 and W3 the steps after
    a new profile ran slower than the chosen trial's (bench/RESULTS.md, session 27). When
    no plan was kept (the chosen trial or the last one was not planned), the chosen count is
    profiled again.

    These are real training steps: the model trains while tune() runs (the losses are those of
    the same steps without TeraIO, since checkpointing recomputes the same values). A trial whose
    profiled step cannot be planned (the budget is below what one operator needs) is recorded
    as failed and the search goes on; an error inside a step propagates, since the step may
    have left the training half updated. Returns the Choice; the chosen count stays applied and
    the session is planned for it (tune() runs the extra profile steps when the last trial was
    another count and no plan of it is kept). `on_trial(trial)`, when given, runs after each
    trial while the session still holds that trial's profile (and plan, unless the trial
    failed), e.g. to save its trace.
    """
    recomputation = layers if isinstance(layers, Recomputation) else Recomputation(layers)
    n = recomputation.layers
    if measure_steps < 0:
        raise ValueError(f"tune: measure_steps must be >= 0 (got {measure_steps})")
    if counts is not None:
        counts = list(counts)
        bad = [c for c in counts if not 0 <= c <= n]
        if bad or not counts:
            raise ValueError(f"tune: counts must be a non-empty list of numbers between 0 and {n} (got {counts})")
    say = progress or (lambda line: None)
    state = {"steps": 0}
    order: list = []  # the trials run
    kept = {"trial": None, "plan": None}  # the fastest planned trial and its plan, for use_plan()

    def run_step():
        """One step; raises _PlanFailed when only the planning at its end failed."""
        completed = False
        try:
            with session.step():
                step()
                completed = True
        except _native.Error as error:
            # An error inside the step (an operator's fetch, reactive eviction) may have left
            # the training state half updated: it propagates. Planning runs after a complete
            # step, so its failure leaves the model as the step left it.
            if completed and session.report()["steps"][-1].get("plan_error"):
                raise _PlanFailed(str(error).splitlines()[0][:200]) from error
            raise
        finally:
            state["steps"] += completed

    def run_steps_until_planned(retime=True):
        # A warm-up step (after the passive phase), the profile steps, then the plan; then the
        # steps that time their operators for a new plan (Session(retime_steps=N)), which run
        # the profile's plan with timing on: untimed, so that every count is timed on the plan
        # its later steps run (and the chosen one's steps after tune() are all on it).
        for _ in range(64):
            run_step()
            if session.last_step["planned_now"]:
                break
        else:
            raise _error("tune: the session did not plan within 64 steps", "internal error")
        for _ in range(session.retime_steps_left if retime else 0):
            run_step()

    def trial(count):
        recomputation.set(count)
        if session.phase != "warmup":
            session.reprofile()
        try:
            run_steps_until_planned(retime=measure_steps > 0)
            times, moved = [], []
            for _ in range(measure_steps):
                run_step()
                times.append(session.last_step["time_s"])
                moved.append(session.last_step["bytes_offloaded"])
        except _PlanFailed as failure:
            result = Trial(count, None, "failed", None, None, error=str(failure))
        else:
            plan = session.report()["plan"]
            fastest = min(range(len(times)), key=times.__getitem__) if times else None
            result = Trial(count, None if fastest is None else times[fastest], session.phase,
                           plan.get("predicted_step_s"), True if session.phase == "passive" else plan.get("stall_free"),
                           0 if fastest is None else moved[fastest])
        order.append(result)
        if session.phase == "planned" and best() is result:
            kept.update(trial=None, plan=None)  # the old one goes before the copy is made
            kept.update(trial=result, plan=session.keep_plan())
        say(f"trial {len(order)}: {result.describe()}")
        if on_trial is not None:
            on_trial(result)
        return result

    def best():
        done = [t for t in order if not t.failed and t.rank_s is not None]
        return min(done, key=lambda t: t.rank_s) if done else None

    if counts is not None:
        for count in counts:
            trial(count)
    else:
        stride = max(1, n // 4)
        previous = None
        for count in coarse_counts(n, stride):
            if len(order) >= max_trials:
                break
            result = trial(count)
            leader = best()
            if result.failed or (leader is not None and previous is not None and None not in (result.rank_s, previous.rank_s)
                                 and result.rank_s > leader.rank_s * (1 + slower_stop)
                                 and result.rank_s > previous.rank_s):
                break  # fewer recomputed layers only adds memory to move
            previous = result
        while stride > 1 and len(order) < max_trials and best() is not None:
            stride = (stride + 1) // 2
            centre = best().count
            # A count no plan reached bounds the counts below it: they need more memory still.
            floor = max((t.count for t in order if t.failed), default=-1)
            for count in (centre - stride, centre + stride):
                if floor < count <= n and all(t.count != count for t in order) and len(order) < max_trials:
                    trial(count)
    chosen = best()
    if chosen is None:
        raise _error("tune: no count of recomputed layers could be planned: " +
                     "; ".join(t.describe() for t in order), "infeasible")
    returned_by = ""
    if order[-1] is not chosen:
        recomputation.set(chosen.count)
        if kept["trial"] is chosen and session.phase == "planned":
            session.use_plan(kept["plan"])
            returned_by = "its trial's plan kept"
        elif order[-1].count != chosen.count:  # (a count given twice runs on as it is)
            session.reprofile()
            run_steps_until_planned()
            returned_by = "profiled again"
    kept.update(trial=None, plan=None)
    choice = Choice(chosen.count, n, order, state["steps"], returned_by)
    say(choice.describe())
    return choice
