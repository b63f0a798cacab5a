"""Positioning: a planned step that follows anything which moved tensors outside the plan (a new
plan, a diverged step, resident(), a close() that failed) first puts them where the plan has them
at each step's start, and training stays bit-exact."""
import torch

from test_session_faults import _data, _model, _reference, _session, _step


def test_the_step_after_resident_starts_where_the_plan_does(tmp_path):
    # resident() brings every tracked tensor back between steps, the ones the plan has away at
    # each step's start included: the next planned step sends them out before its first operator
    # instead of evicting them on the way.
    data = _data(8)
    reference_losses, reference = _reference(data)
    model, optimizer = _model()
    session = _session(tmp_path, 1_200_000)
    losses = [_step(model, optimizer, x, y, session) for x, y in data[:5]]
    assert session.phase == "planned"
    with session.resident():
        pass
    losses += [_step(model, optimizer, x, y, session) for x, y in data[5:]]
    steps = session.report()["steps"]
    assert [s["phase"] for s in steps[-3:]] == ["planned"] * 3
    after, later = steps[-3], steps[-2:]
    assert after["positioned"] > 0 and all(s["positioned"] == 0 for s in later), steps
    session.close()
    assert all(torch.equal(a, b) for a, b in zip(reference_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
