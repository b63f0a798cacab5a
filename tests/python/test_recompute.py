"""teraio.recompute: checkpointing of the last layers, a session profiled again when the step
changes, and tune() choosing the count by measuring, with losses, parameters and optimizer
state bit for bit those of the same training without TeraIO or checkpointing."""
import contextlib
import copy

import pytest
import torch

import teraio
from same_training import assert_same_training, footprint, reference
from teraio import recompute
from teraio.models import GPT, GPTConfig, make_batch

CONFIG = GPTConfig(vocab=64, d_model=64, layers=4, heads=2, seq=16, batch=4, tie_weights=False)
FAST = {key: 1e12 for key in ("d2h", "h2d", "ssd_read", "ssd_write")}


def _setup():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)


class Trainer:
    """The same batches, one per step, in every run."""

    def __init__(self):
        self.model, self.optimizer = _setup()
        self.generator = torch.Generator().manual_seed(7)
        self.losses = []

    def step(self):
        tokens, targets = make_batch(self.generator, CONFIG.batch, CONFIG.seq, CONFIG.vocab)
        loss = self.model(tokens, targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss.detach().clone())

    def state(self):
        return ([p.detach().clone() for p in self.model.parameters()],
                [t.detach().clone() for s in self.optimizer.state.values() for t in s.values()])




def _two_planned_steps_as_planned(session, trainer):
    """Two more steps run the session's plan: planned, no step diverged, the executor moving
    what the plan says (planned offloads)."""
    for _ in range(2):
        with session.step():
            trainer.step()
    steps = session.report()["steps"]
    assert [s["phase"] for s in steps[-2:]] == ["planned", "planned"]
    assert not any(s["diverged"] for s in steps), [s["diverged"] for s in steps]
    assert all(s["bytes_offloaded"] > 0 and s["planned_offloads"] > 0 for s in steps[-2:])


def test_recomputation_wraps_the_last_layers_and_unwraps_them():
    model, _ = _setup()
    r = recompute.Recomputation(model.blocks)
    r.set(3)
    assert [("forward" in vars(b)) for b in model.blocks] == [False, True, True, True]
    r.set(1)
    assert [("forward" in vars(b)) for b in model.blocks] == [False, False, False, True]
    r.set(0)
    assert not any("forward" in vars(b) for b in model.blocks)
    with pytest.raises(ValueError, match="between 0 and 4"):
        r.set(5)
    model.blocks[0].forward = lambda x: x
    with pytest.raises(ValueError, match="already has its forward replaced"):
        recompute.Recomputation(model.blocks)
    with pytest.raises(ValueError, match="no layers"):
        recompute.Recomputation([])


def test_checkpointed_training_is_exact_without_a_session():
    want = reference(Trainer, 3)
    got = Trainer()
    recompute.Recomputation(got.model.blocks).set(4)
    for _ in range(3):
        got.step()
    assert_same_training(want, got)


def test_tune_measures_every_count_and_keeps_training_exact(tmp_path):
    budget = footprint(Trainer) // 2
    trainer = Trainer()
    session = teraio.Session(gpu_budget=budget, ssd=[tmp_path], ssd_capacity="64MiB", device="cpu",
                             warmup_steps=1, profile_steps=1, bandwidths=FAST)
    lines, traces = [], []

    def save_trial(trial):
        # Each trial's own profile: its operators grow as fewer layers are recomputed.
        path = tmp_path / f"c{trial.count}.tiotrace"
        session.save_trace(path)
        traces.append((trial.count, path.stat().st_size))

    choice = recompute.tune(session, trainer.model.blocks, trainer.step, counts=[4, 2, 0], measure_steps=1,
                            progress=lines.append, on_trial=save_trial)
    assert [t.count for t in choice.trials] == [4, 2, 0]
    assert [count for count, _ in traces] == [4, 2, 0]
    assert traces[0][1] > traces[1][1] > traces[2][1], traces
    assert all(t.step_s is not None and t.step_s > 0 for t in choice.trials), choice.trials
    assert choice.count in (4, 2, 0) and choice.layers == 4
    assert choice.steps == len(trainer.losses)
    assert len(lines) == 4 and lines[-1].startswith("recompute ")
    # Planned for the chosen count: later steps run that plan without diverging.
    assert session.phase == "planned"
    _two_planned_steps_as_planned(session, trainer)
    session.close()
    assert_same_training(reference(Trainer, len(trainer.losses)), trainer)


def test_reprofile_after_the_passive_phase_observes_again(tmp_path):
    trainer = Trainer()
    model_bytes = footprint(Trainer)
    # Room for everything: the session goes passive (nothing observed, nothing moved)...
    session = teraio.Session(gpu_budget=model_bytes * 2, device="cpu", warmup_steps=1, profile_steps=1)
    for _ in range(2):
        with session.step():
            trainer.step()
    assert session.phase == "passive"
    assert session.report()["plan"]["profiled_step_s"] > 0
    # ...and a step made larger on purpose is warmed up, profiled and planned again.
    session.reprofile()
    assert session.phase == "warmup"
    # Observed again knowing every storage that lives across steps (the optimizer state among
    # them), so that reactive eviction counts memory the next step has not touched yet.
    large = [p for p in trainer.model.parameters() if p.numel() * p.element_size() >= 4096]  # min_tensor_bytes
    count, size = session.locations()["device"]
    assert count >= 3 * len(large) and size >= 3 * sum(p.numel() * p.element_size() for p in large)
    phases = []
    for _ in range(3):
        with session.step():
            trainer.step()
        phases.append(session.last_step["phase"])
    assert phases == ["warmup", "profile", "passive"], phases
    assert session.phase == "passive"
    session.close()
    with pytest.raises(teraio.Error, match="closed"):
        session.reprofile()
    assert_same_training(reference(Trainer, 5), trainer)


def test_reprofile_inside_a_step_is_refused(tmp_path):
    trainer = Trainer()
    session = teraio.Session(gpu_budget="1GiB", device="cpu")
    with pytest.raises(teraio.Error, match="inside session.step"):
        with session.step():
            trainer.step()
            session.reprofile()
    session.close()


class FakeSession:
    """Step times from a function of the count: tune()'s search, without training. Planning
    fails (as end_step raises it: after a complete step) for the counts in `unplannable`."""

    def __init__(self, time_of, recomputation, unplannable=(), passive=()):
        self.time_of, self.recomputation, self.unplannable = time_of, recomputation, set(unplannable)
        self.passive = set(passive)  # counts whose profile needs no plan: the session goes passive
        self.phase, self.left, self.last_step, self.reprofiles = "warmup", 2, None, 0
        self.plan_of, self.plans = None, 0  # the count the running plan was profiled at; plans made
        self.kept, self.used = [], []  # counts of the plans keep_plan() and use_plan() saw
        self.used_plans = []  # which plan (1 for the first made) use_plan() got
        self.device = "cpu"
        self.records = []
        self.predicted_of = None  # the simulator's step for a count's plan
        self.retime_steps_left = 0  # Session(retime_steps=0)

    def reprofile(self):
        self.phase, self.left = "profile", 1
        self.reprofiles += 1

    def keep_plan(self):
        assert self.phase == "planned", self.phase
        self.kept.append(self.plan_of)
        return self.plan_of, self.plans

    def use_plan(self, kept):
        assert self.phase == "planned", self.phase
        self.plan_of, number = kept
        self.used.append(self.plan_of)
        self.used_plans.append(number)

    @contextlib.contextmanager
    def step(self):
        yield self
        planned_now, plan_error = False, ""
        if self.phase in ("warmup", "profile"):
            self.left -= 1
            if self.left == 0:
                if self.recomputation.count in self.unplannable:
                    plan_error = "gpu_budget is below what operator 7 needs at once"
                elif self.recomputation.count in self.passive:
                    self.phase, planned_now = "passive", True  # planning found nothing to move
                else:
                    self.phase, planned_now = "planned", True
                    self.plan_of, self.plans = self.recomputation.count, self.plans + 1
        self.records.append({"step": len(self.records), "plan_error": plan_error})
        if plan_error:
            error = teraio.Error(plan_error)
            error.kind = "infeasible"
            raise error
        self.last_step = {"planned_now": planned_now, "time_s": self.time_of(self.recomputation.count),
                          "bytes_offloaded": 0}

    def report(self):
        predicted = self.predicted_of(self.recomputation.count) if self.predicted_of else None
        return {"plan": {"predicted_step_s": predicted, "stall_free": True}, "steps": self.records}


def _search(time_of, layers=16, unplannable=(), step=lambda: None, passive=(), **kw):
    r = recompute.Recomputation([torch.nn.Linear(1, 1) for _ in range(layers)])
    session = FakeSession(time_of, r, unplannable, passive)
    choice = recompute.tune(session, r, step, progress=None, **kw)
    return choice, [t.count for t in choice.trials], session


def test_search_scans_down_then_refines_around_the_fastest():
    choice, tried, session = _search(lambda c: abs(c - 5) + 1.0)
    assert tried[:5] == [16, 12, 8, 4, 0]
    assert choice.count == 5 and len(tried) <= 9
    assert session.phase == "planned" and session.recomputation.count == 5


def test_search_stops_descending_once_slower_and_worsening():
    choice, tried, _ = _search(lambda c: 1.0 + (16 - c) ** 2, layers=16)
    assert tried == [16, 12, 14, 15], tried  # 12 is slower than 16: no coarse step below it
    assert choice.count == 16


def test_search_sets_the_chosen_count_back_with_the_plan_its_trial_ran():
    choice, tried, session = _search(lambda c: 1.0 if c == 4 else 2.0, layers=4)
    assert tried == [4, 3]
    assert choice.count == 4 and session.recomputation.count == 4
    assert session.reprofiles == 1  # the other trial only: the chosen count is not profiled again
    assert session.kept == [4] and session.used == [4] and session.plan_of == 4
    assert choice.returned_by == "its trial's plan kept" and "its trial's plan kept" in choice.describe()
    assert choice.steps == len(session.records) == 4 + 3  # trial 4, trial 3, and no step to go back


def test_only_a_faster_trial_replaces_the_kept_plan():
    _, tried, session = _search(lambda c: {4: 3.0, 3: 1.0, 2: 2.0}[c], layers=4, counts=[4, 3, 2])
    assert tried == [4, 3, 2]
    assert session.kept == [4, 3] and session.used == [3] and session.plan_of == 3


def test_a_count_given_twice_goes_back_to_the_plan_of_its_faster_trial():
    times = [1.0, 3.0, 2.0]  # 4, then 3, then 4 again: the first trial of 4 is the fastest
    r = recompute.Recomputation([torch.nn.Linear(1, 1) for _ in range(4)])
    session = FakeSession(lambda c: times[session.reprofiles], r)
    choice = recompute.tune(session, r, lambda: None, counts=[4, 3, 4], measure_steps=1, progress=None)
    assert [t.step_s for t in choice.trials] == [1.0, 3.0, 2.0]
    assert choice.trials[0].step_s == 1.0 and choice.count == 4
    assert session.used == [4] and session.used_plans == [1]  # the first trial's, not the last's
    assert choice.returned_by == "its trial's plan kept"
    assert session.reprofiles == 2  # for 3 and for 4 again: none to go back


def test_search_profiles_the_chosen_count_again_when_it_cannot_use_the_kept_plan():
    # The last trial's session went passive: a kept plan needs a planned session to go back to.
    choice, tried, session = _search(lambda c: 1.0 if c == 4 else 2.0, layers=4, passive=[3])
    assert tried == [4, 3]
    assert choice.count == 4 and session.used == [] and session.reprofiles == 2
    assert session.phase == "planned" and session.plan_of == 4
    assert choice.returned_by == "profiled again"


def test_without_timed_steps_the_search_ranks_counts_by_their_predicted_steps():
    r = recompute.Recomputation([torch.nn.Linear(1, 1) for _ in range(4)])
    # Measured, 4 would win; the simulator prefers 3, and no step is timed.
    session = FakeSession(lambda c: 1.0 if c == 4 else 2.0, r)
    session.predicted_of = lambda c: 1.0 if c == 3 else 2.0
    lines = []
    choice = recompute.tune(session, r, lambda: None, counts=[4, 3, 2], measure_steps=0, progress=lines.append)
    assert [t.step_s for t in choice.trials] == [None, None, None]
    assert [t.predicted_step_s for t in choice.trials] == [2.0, 1.0, 2.0]
    assert not any(t.failed for t in choice.trials)
    assert choice.count == 3 and r.count == 3 and session.phase == "planned"
    # Two steps for the first trial (warm-up, profile), one for each other; 3 goes back to its
    # kept plan without a step; no step is timed.
    assert choice.steps == 2 + 1 + 1 == len(session.records)
    assert session.used == [3]
    assert "3 recomputed: predicted 1.000 s (planned, not timed)" in lines[1]


def test_tune_refuses_bad_counts():
    r = recompute.Recomputation([torch.nn.Linear(1, 1)])
    with pytest.raises(ValueError, match="between 0 and 1"):
        recompute.tune(FakeSession(lambda c: 1.0, r), r, lambda: None, counts=[2], progress=None)
    with pytest.raises(ValueError, match="measure_steps"):
        recompute.tune(FakeSession(lambda c: 1.0, r), r, lambda: None, measure_steps=-1, progress=None)


def test_a_count_that_cannot_be_planned_is_a_failed_trial_and_bounds_the_search():
    # Fewer than 8 recomputed layers cannot be planned; 8 is the fastest that can.
    choice, tried, session = _search(lambda c: 1.0 + c / 16, unplannable=range(8))
    failed = [t for t in choice.trials if t.failed]
    # The coarse scan stops at 4; refining tries 6 and 7, never what a failure bounds (0, 5).
    assert [t.count for t in failed] == [4, 6, 7], tried
    assert 0 not in tried and 5 not in tried
    assert "operator 7" in failed[0].error and failed[0].phase == "failed"
    assert all(t.count >= 8 for t in choice.trials if t.step_s is not None)
    assert choice.count == 8 and choice.steps == len(session.records)


def test_every_count_unplannable_raises_an_infeasible_teraio_error():
    with pytest.raises(teraio.Error, match="no count of recomputed layers could be planned") as failure:
        _search(lambda c: 1.0, layers=2, unplannable=range(3))
    assert failure.value.kind == "infeasible"


def test_an_error_inside_a_step_propagates():
    def step():
        error = teraio.Error("cannot fetch tensor 3")
        error.kind = "I/O error"
        raise error

    with pytest.raises(teraio.Error, match="cannot fetch"):
        _search(lambda c: 1.0, layers=2, step=step)


def test_reprofile_during_warmup_keeps_the_warmup():
    trainer = Trainer()
    session = teraio.Session(gpu_budget="1GiB", device="cpu", warmup_steps=1, profile_steps=1)
    session.reprofile()
    assert session.phase == "warmup"
    with session.step():
        trainer.step()
    assert session.last_step["phase"] == "warmup"
    session.close()


def test_a_deepcopy_checkpoints_its_own_layers():
    model, _ = _setup()
    recompute.Recomputation(model.blocks).set(2)
    twin = copy.deepcopy(model)
    assert twin.blocks[3].forward.__self__ is twin.blocks[3]
    assert recompute.Recomputation(twin.blocks).count == 2  # an earlier wrapping is counted
    tokens, targets = make_batch(torch.Generator().manual_seed(3), CONFIG.batch, CONFIG.seq, CONFIG.vocab)
    with torch.no_grad():
        for p in twin.blocks[3].parameters():
            p.zero_()
    assert not torch.equal(model(tokens, targets), twin(tokens, targets))


def test_a_kept_plan_runs_again_after_another_count_and_training_stays_exact(tmp_path):
    budget = footprint(Trainer) // 2
    trainer = Trainer()
    layers = recompute.Recomputation(trainer.model.blocks)
    session = teraio.Session(gpu_budget=budget, ssd=[tmp_path], ssd_capacity="64MiB", device="cpu",
                             warmup_steps=1, profile_steps=1, bandwidths=FAST)
    with pytest.raises(teraio.Error, match="keeps the plan of a planned session; this one is warmup"):
        session.keep_plan()

    def until_planned():
        for _ in range(4):
            with session.step():
                trainer.step()
            if session.phase == "planned":
                return
        raise AssertionError(f"not planned: {session.phase}")

    layers.set(4)
    until_planned()
    kept = session.keep_plan()
    plan = session.report()["plan"]
    assert kept.operators == plan["trace_ops"] and kept.migrations > 0
    assert kept.predicted_step_s == plan["predicted_step_s"]
    assert "migrations>" in repr(kept)

    layers.set(0)
    session.reprofile()
    with pytest.raises(teraio.Error, match="replaces the plan of a planned session; this one is profile"):
        session.use_plan(kept)
    until_planned()
    assert session.report()["plan"]["trace_ops"] != kept.operators  # another step, another plan

    # Back to 4 recomputed layers on the kept plan: no profile step, nothing diverges.
    layers.set(4)
    session.use_plan(kept)
    plan = session.report()["plan"]
    assert plan["trace_ops"] == kept.operators and plan["predicted_step_s"] == kept.predicted_step_s
    assert len(session.migrations()) == kept.migrations
    _two_planned_steps_as_planned(session, trainer)

    # A kept plan given to another step: the step diverges and runs reactively, as from any plan.
    layers.set(2)
    session.use_plan(kept)
    with session.step():
        trainer.step()
    assert session.report()["steps"][-1]["diverged"]
    session.close()
    assert_same_training(reference(Trainer, len(trainer.losses)), trainer)


def test_a_kept_plan_keeps_its_retimes_due_and_its_session(tmp_path):
    trainer = Trainer()
    session = teraio.Session(gpu_budget=footprint(Trainer) // 2, ssd=[tmp_path], ssd_capacity="64MiB",
                             device="cpu", warmup_steps=1, profile_steps=1, bandwidths=FAST, retime_steps=1)
    for _ in range(2):
        with session.step():
            trainer.step()
    assert session.phase == "planned" and session.retime_steps_left == 1
    kept = session.keep_plan()  # planned from the profile, not yet retimed
    with session.step():
        trainer.step()
    assert session.last_step["retimed"] and session.retime_steps_left == 0
    session.use_plan(kept)
    assert session.retime_steps_left == 1  # the kept plan is retimed as it would have been
    other = teraio.Session(gpu_budget=footprint(Trainer) // 2, device="cpu")
    with pytest.raises(teraio.Error, match="takes a plan this session kept"):
        other.use_plan(kept)
    other.close()
    session.close()


def test_use_plan_inside_a_step_is_refused(tmp_path):
    trainer = Trainer()
    session = teraio.Session(gpu_budget=footprint(Trainer) // 2, ssd=[tmp_path], ssd_capacity="64MiB",
                             device="cpu", warmup_steps=1, profile_steps=1, bandwidths=FAST)
    for _ in range(2):
        with session.step():
            trainer.step()
    kept = session.keep_plan()
    with pytest.raises(teraio.Error, match="inside session.step"):
        with session.step():
            session.use_plan(kept)
    with pytest.raises(TypeError):
        session.use_plan("a plan")
    session.close()
    with pytest.raises(teraio.Error, match="closed"):
        session.keep_plan()


def test_stall_rounds_caps_the_planners_stall_search_and_training_stays_exact(tmp_path):
    # Links too slow for the stall-free plan to fit: the planner plans waits, round by round.
    slow = {key: 2e7 for key in ("d2h", "h2d", "ssd_read", "ssd_write")}
    rounds = {}
    for cap in (None, 3, 0):
        trainer = Trainer()
        (tmp_path / str(cap)).mkdir()
        session = teraio.Session(gpu_budget=footprint(Trainer) // 2, ssd=[tmp_path / str(cap)], ssd_capacity="64MiB",
                                 device="cpu", warmup_steps=1, profile_steps=1, bandwidths=slow, stall_rounds=cap)
        for _ in range(3):
            with session.step():
                trainer.step()
        plan = session.report()["plan"]
        assert session.phase == "planned" and plan["stall_free"] is False, plan
        rounds[cap] = plan["stall_rounds"]
        session.close()
        assert_same_training(reference(Trainer, 3), trainer)
    assert rounds[0] == 0 and rounds[3] == 3 and rounds[None] > 3, rounds
    with pytest.raises(teraio.Error, match="stall_rounds must be >= 0"):
        teraio.Session(gpu_budget="1GiB", device="cpu", stall_rounds=-1)
