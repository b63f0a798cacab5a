"""Storage-engine faults, divergence and misuse: clear errors, no hang, no lost tensor."""
import pytest
import torch

import teraio


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _step(model, optimizer, x, y, session):
    with session.step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss.detach().clone()


def _data(n, batch=32):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 128, generator=g), torch.randint(0, 8, (batch,), generator=g)) for _ in range(n)]


def _session(tmp_path, budget, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return teraio.Session(gpu_budget=budget, ssd=[tmp_path], ssd_capacity="64MiB", device="cpu", **kw)


def _reference(data):
    """Losses and model of the same training without TeraIO."""
    model, optimizer = _model()
    losses = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().clone())
    return losses, model


def test_read_fault_ends_the_step_with_a_teraio_error_and_loses_nothing(tmp_path):
    model, optimizer = _model()
    data = _data(7)
    session = _session(tmp_path, 1_200_000, _fault_injection=True)
    for x, y in data[:4]:
        _step(model, optimizer, x, y, session)
    assert session.phase == "planned"
    session._set_faults(reads=True)
    # A failed read surfaces where the session waits for it: in the step (a fetch before an
    # operator, which stops the training code at its next statement) or, for a prefetch of
    # the next step, in resident().
    with pytest.raises(teraio.Error) as failure:
        for x, y in data[4:6]:
            _step(model, optimizer, x, y, session)
        with session.resident():
            pass
    assert failure.value.kind == "I/O error"
    session._set_faults(reads=False)
    # Every tensor's bytes were kept where they were valid: all come back when the session
    # closes, and training goes on under a new one.
    session.close()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(t).all() for state in optimizer.state.values() for t in state.values())
    optimizer.zero_grad()
    fresh = _session(tmp_path / "again", 1_200_000)
    assert torch.isfinite(_step(model, optimizer, *data[6], fresh))
    fresh.close()


def test_write_fault_keeps_the_tensor_resident_and_raises(tmp_path):
    model, optimizer = _model()
    data = _data(6)
    session = _session(tmp_path, 1_200_000, _fault_injection=True)
    for x, y in data[:3]:
        _step(model, optimizer, x, y, session)
    session._set_faults(writes=True)
    # Offloads run behind the computation: the failure surfaces at the next point where the
    # session waits for it, in this step, a later one, or resident().
    with pytest.raises(teraio.Error) as failure:
        for x, y in data[3:]:
            _step(model, optimizer, x, y, session)
        with session.resident():
            pass
    assert failure.value.kind == "I/O error"
    session._set_faults(writes=False)
    with session.resident():
        assert all(torch.isfinite(p).all() for p in model.parameters())
    session.close()


def test_a_close_that_fails_leaves_the_session_open_and_training_exact(tmp_path):
    # close() brings every tensor back; where it cannot (a read fails here, W3's states that do
    # not fit the device on the GPU) it raises, and the session must stay open with nothing lost:
    # training goes on, and a later close() succeeds.
    data = _data(8)
    reference_losses, reference = _reference(data)
    model, optimizer = _model()
    session = _session(tmp_path, 1_200_000, _fault_injection=True)
    losses = [_step(model, optimizer, x, y, session) for x, y in data[:5]]
    assert session.phase == "planned"
    assert session.report()["steps"][-1]["bytes_offloaded"] > 0
    session._set_faults(reads=True)
    with pytest.raises(teraio.Error) as failure:
        session.close()
    assert failure.value.kind == "I/O error"
    # Said with what close() had to do and how far it got, not only the tensor that failed.
    message = str(failure.value)
    assert "session.close() brings every tensor the session moved off cpu back" in message, message
    assert "were away" in message and "The session stays open with nothing lost" in message, message
    assert "no room" not in message, message  # the advice for a device out of memory only
    session._set_faults(reads=False)
    assert session.phase == "planned"
    losses += [_step(model, optimizer, x, y, session) for x, y in data[5:]]
    assert [s["phase"] for s in session.report()["steps"][-3:]] == ["planned"] * 3
    session.close()
    assert session.phase == "closed"
    assert all(torch.equal(a, b) for a, b in zip(reference_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))


def test_full_ssd_tier_raises_tier_full(tmp_path):
    model, optimizer = _model()
    session = teraio.Session(gpu_budget=1_200_000, ssd=[tmp_path], ssd_capacity="64KiB", device="cpu")
    with pytest.raises(teraio.Error) as failure:
        for x, y in _data(3):
            _step(model, optimizer, x, y, session)
    assert failure.value.kind in ("tier full", "infeasible")
    session.close()


def test_budget_below_any_plan_is_refused(tmp_path):
    model, optimizer = _model()
    session = _session(tmp_path, 64 << 10)
    with pytest.raises(teraio.Error) as failure:
        for x, y in _data(4):
            _step(model, optimizer, x, y, session)
    assert failure.value.kind in ("infeasible", "tier full")
    assert "budget" in str(failure.value)
    session.close()


def test_divergent_step_runs_reactively_and_stays_exact(tmp_path):
    def run(session):
        model, optimizer = _model()
        losses = []
        for i, (x, y) in enumerate(_data(8)):
            if i == 5:  # a different batch size: another operator sequence
                x, y = x[:16], y[:16]
            if session is None:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                losses.append(loss.detach().clone())
            else:
                losses.append(_step(model, optimizer, x, y, session))
        return losses, [p.detach().clone() for p in model.parameters()]

    reference = run(None)
    session = _session(tmp_path, 1_200_000)
    result = run(session)
    steps = session.report()["steps"]
    assert any(s["diverged"] for s in steps), steps
    assert all(torch.equal(a, b) for a, b in zip(reference[0], result[0]))
    assert all(torch.equal(a, b) for a, b in zip(reference[1], result[1]))
    session.close()


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError):
        teraio.Session(gpu_budget="lots", device="cpu")
    with pytest.raises(teraio.Error):
        teraio.Session(device="cpu", profile_steps=0)
    with pytest.raises(teraio.Error, match="retime_steps must be >= 0"):
        teraio.Session(device="cpu", retime_steps=-1)
    # The hole counts in the budget: it must leave some to the tracked tensors.
    with pytest.raises(teraio.Error, match=r"hole_bytes \(1\.0 MiB\) must be below gpu_budget \(1\.0 MiB\)"):
        teraio.Session(device="cpu", gpu_budget="1MiB", hole_bytes="1MiB")
    with pytest.raises(teraio.Error, match=r"must be below gpu_budget \(none\)"):
        teraio.Session(device="cpu", hole_bytes="1MiB")
    with pytest.raises(ValueError, match="hole_bytes"):
        teraio.Session(device="cpu", gpu_budget="2MiB", hole_bytes="big")
    with pytest.raises(teraio.Error):
        teraio.Session(device="cpu", ssd=[tmp_path / "does-not-exist"], ssd_capacity="1MiB")
    with pytest.raises(ValueError, match=r"unknown key 'both'.*duplex"):
        teraio.Session(device="cpu", bandwidths={"both": 1e9})
    with pytest.raises(teraio.Error, match=r'bandwidths\["duplex"\] must be a finite number of bytes/s >= 0'):
        teraio.Session(device="cpu", bandwidths={"duplex": -1})
    with pytest.raises(teraio.Error, match=r"plan_margin \(2\.0 MiB\) must be below the budget tracked tensors get "
                                           r"\(2\.0 MiB\)"):
        teraio.Session(device="cpu", gpu_budget="2MiB", plan_margin="2MiB")
    with pytest.raises(ValueError, match="plan_margin"):
        teraio.Session(device="cpu", gpu_budget="2MiB", plan_margin="wide")
    # The hole's own check comes first; without a budget nothing is planned, so no margin.
    with pytest.raises(teraio.Error, match=r"hole_bytes \(2\.0 MiB\) must be below gpu_budget"):
        teraio.Session(device="cpu", gpu_budget="2MiB", hole_bytes="2MiB", plan_margin="1MiB")
    assert teraio.Session(device="cpu", plan_margin="1MiB").report()["plan"]["plan_margin_bytes"] == 0
    for lead in (-1, float("nan")):
        with pytest.raises(teraio.Error, match="early_prefetch_lead must be a number >= 0"):
            teraio.Session(device="cpu", early_prefetch_lead=lead)
    assert teraio.Session(device="cpu").report()["plan"]["early_prefetch_lead"] == 100
    for share in (-0.1, 1, float("nan")):
        with pytest.raises(teraio.Error, match=r"min_migration_share must be a number in \[0, 1\)"):
            teraio.Session(device="cpu", min_migration_share=share)
    assert teraio.Session(device="cpu").report()["plan"]["min_migration_share"] == 1 / 65536
    assert teraio.Session(device="cpu").report()["plan"]["record_releases"] is True
    assert teraio.Session(device="cpu", gpu_budget="64MiB").report()["plan"]["plan_margin_bytes"] == (64 << 20) // 256
    for latency in (-1e-6, 2, float("nan")):
        with pytest.raises(ValueError, match="request_latency must be between 0 and 1 second"):
            teraio.Session(device="cpu", request_latency=latency)
    with pytest.raises(teraio.Error, match=r'bandwidths\["d2h"\]'):
        teraio.Session(device="cpu", bandwidths={"d2h": float("nan")})
    session = teraio.Session(device="cpu")
    with pytest.raises(teraio.Error):
        with session.step():
            with session.step():
                pass
    session.close()
    with pytest.raises(teraio.Error):
        with session.step():
            pass


def test_torch_compile_is_refused_clearly(monkeypatch):
    dynamo = pytest.importorskip("torch._dynamo")
    if not hasattr(dynamo, "utils"):
        pytest.skip("this torch has no dynamo counters")
    monkeypatch.setitem(dynamo.utils.counters["frames"], "ok", 1)
    session = teraio.Session(device="cpu")
    with pytest.raises(teraio.Error) as failure:
        with session.step():
            pass
    assert failure.value.kind == "unsupported" and "torch.compile" in str(failure.value)
    session.close()


def test_storages_over_foreign_memory_are_left_alone_and_report_outlives_close(tmp_path):
    # from_numpy / DataLoader shared-memory batches have no allocator: never moved, never a crash.
    import numpy

    model, optimizer = _model()
    session = _session(tmp_path, 1_200_000)
    for x, y in _data(5):
        x = torch.from_numpy(numpy.ascontiguousarray(x.numpy()))
        _step(model, optimizer, x, y, session)
    session.close()
    assert "ssd path" in str(session.report())


def test_eval_between_steps_after_zero_grad_is_exact(tmp_path):
    model, optimizer = _model()
    reference_model, reference_optimizer = _model()
    session = _session(tmp_path, 1_200_000)
    probe = torch.randn(16, 128, generator=torch.Generator().manual_seed(9))
    for x, y in _data(6):
        _step(model, optimizer, x, y, session)
        loss = torch.nn.functional.cross_entropy(reference_model(x), y)
        loss.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        with torch.no_grad():
            assert torch.equal(model(probe), reference_model(probe))
    session.close()


def test_locations_say_where_the_storages_are(tmp_path):
    model, optimizer = _model()
    session = _session(tmp_path, 1_200_000)
    for x, y in _data(5):
        _step(model, optimizer, x, y, session)
    where = session.locations()
    assert set(where) <= {"device", "offloading", "host", "ssd", "fetching"}
    assert sum(count for count, _ in where.values()) > 0
    assert where.get("ssd", (0, 0))[1] > 0  # under this budget something lives on the SSD tier
    with session.resident():
        assert set(session.locations()) == {"device"}
    session.close()
    assert session.locations() == {}
