"""bench/device_stalls.py: the runtime's device waits lined up with the simulated stalls, by
operator and by stretch of the step."""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import device_stalls  # noqa: E402


def op_event(k, phase, start_ms, dur_ms, stall_ms=0.0, name="aten::mm"):
    return {"ph": "X", "pid": 1, "tid": 1, "cat": phase, "name": name, "ts": start_ms * 1e3, "dur": dur_ms * 1e3,
            "args": {"op": k, "stall_us": stall_ms * 1e3}}


# Two micro-batches (forward, backward) and the optimizer, 10 ms an operator; the simulation
# stalls 5 ms before op 3 and 2 ms before op 7.
TIMELINE = {"traceEvents": [
    {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "teraio simulated step"}},
    op_event(0, "forward", 0, 10), op_event(1, "forward", 10, 10), op_event(2, "backward", 20, 10),
    op_event(3, "backward", 35, 10, stall_ms=5), op_event(4, "forward", 45, 10), op_event(5, "backward", 55, 10),
    op_event(6, "optimizer", 65, 10, name="aten::add_"), op_event(7, "optimizer", 77, 10, stall_ms=2),
    {"ph": "C", "pid": 1, "name": "device memory GiB", "ts": 0, "args": {"used": 1.0}},
]}


def test_operators_are_read_with_their_simulated_stall():
    ops = device_stalls.simulated_ops(TIMELINE)
    assert sorted(ops) == list(range(8))
    assert ops[3].stall_s == pytest.approx(0.005) and ops[3].phase == "backward"
    assert ops[7].start_s == pytest.approx(0.077) and ops[6].name == "aten::add_"


def test_a_timeline_without_operators_is_refused():
    with pytest.raises(ValueError, match="no operators"):
        device_stalls.simulated_ops({"traceEvents": []})


def test_stretches_are_named_in_the_order_they_come():
    ops = device_stalls.simulated_ops(TIMELINE)
    assert device_stalls.stretches(ops) == [("forward 1", 0, 1), ("backward 1", 2, 3), ("forward 2", 4, 4),
                                            ("backward 2", 5, 5), ("optimizer 1", 6, 7)]


def test_the_waits_are_summed_per_stretch_and_the_worst_excess_comes_first():
    ops = device_stalls.simulated_ops(TIMELINE)
    waits = [(3, "copy in", 0.004), (3, "copy out", 0.002), (5, "copy in", 0.020), (7, "copy in", 0.001),
             (99, "copy in", 0.5)]
    report = device_stalls.compare(waits, ops, worst=2)
    assert report["measured_s"]["copy in"] == pytest.approx(0.525)
    assert report["measured_total_s"] == pytest.approx(0.527)
    assert report["simulated_total_s"] == pytest.approx(0.007)
    assert report["unknown_ops"] == [99]
    rows = {r["stretch"]: r for r in report["stretches"]}
    assert rows["backward 1"]["copy in"] == pytest.approx(0.004) and rows["backward 1"]["copy out"] == pytest.approx(0.002)
    assert rows["backward 1"]["simulated_stall_s"] == pytest.approx(0.005)
    assert rows["backward 2"]["copy in"] == pytest.approx(0.020)
    assert rows["optimizer 1"]["simulated_start_s"] == pytest.approx(0.065)
    # Op 99 (not simulated) first, then op 5 (20 ms beyond none); op 3 waited 1 ms beyond its 5.
    assert [w["op"] for w in report["worst"]] == [99, 5]
    text = "\n".join(device_stalls.describe(report, min_s=0.003))
    assert "1 operators with waits are not in the simulated step (first 99)" in text
    assert "forward 1" not in text and "(3 stretches with less than 3 ms either way left out)" in text


def test_waits_say_where_their_copy_stood_and_what_was_due():
    # Since session 37 each wait carries where its copy stood; older files have triples.
    waits = [(3, "copy in", 0.004, "gated"), (5, "copy in", 0.020, "gated"), (7, "copy in", 0.001, "queued"),
             (6, "copy out", 0.002, "flushed"), (6, "abandoned copy out", 0.003, "flushed")]
    assert device_stalls.by_how(waits) == {"gated": [2, pytest.approx(0.024)], "queued": [1, 0.001],
                                           "flushed": [1, 0.002]}
    assert device_stalls.by_how([(3, "copy in", 0.004)]) == {}
    assert device_stalls.measured_by_op(waits)[3]["copy in"] == pytest.approx(0.004)
    # Op 3 has only a 16 KiB prefetch due, op 5 one of 16 KiB and one of 1 MiB, op 7 none.
    plan = [{"direction": "prefetch", "deadline": 3, "bytes": 16 << 10},
            {"direction": "prefetch", "deadline": 5, "bytes": 16 << 10},
            {"direction": "prefetch", "deadline": 5, "bytes": 1 << 20},
            {"direction": "offload", "deadline": 7, "bytes": 1 << 30}]
    split = device_stalls.by_copy_due(waits, plan)
    assert split == {"under 64 KiB": pytest.approx(0.004), "64 KiB or more": pytest.approx(0.020),
                     "no prefetch due there": pytest.approx(0.001)}
    report = device_stalls.compare(waits, device_stalls.simulated_ops(TIMELINE))
    report["by_how"], report["copy_in_by_due"] = device_stalls.by_how(waits), split
    text = "\n".join(device_stalls.describe(report))
    assert "where each copy stood as the wait was queued: flushed 1 waits 0.002 s, gated 2 waits 0.024 s" in text
    assert "largest prefetch due at the operator: under 64 KiB 0.004 s, 64 KiB or more 0.020 s" in text


def test_the_splits_alone_need_only_the_plan(tmp_path, capsys):
    waits = tmp_path / "waits.json"
    waits.write_text(json.dumps({"mode": "teraio-host", "steps": [
        {"step": 4, "time_s": 0.2, "device_stall_s": 0.03,
         "waits": [[3, "copy in", 0.02, "gated"], [5, "copy out", 0.01, "queued"]]}]}))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"migrations": [{"direction": "prefetch", "deadline": 3, "bytes": 8192}]}))
    assert device_stalls.main([str(waits), "--plan", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "step 4: 0.200 s, device stall 0.030 s" in out
    assert "by kind: copy in 0.020 s, copy out 0.010 s, abandoned copy out 0.000 s" in out
    assert "gated 1 waits 0.020 s, queued 1 waits 0.010 s" in out
    assert "under 64 KiB 0.020 s, 64 KiB or more 0.000 s" in out
    with pytest.raises(SystemExit):
        device_stalls.main([str(waits), "--trace", "t.tiotrace"])


def test_an_unknown_wait_kind_is_refused():
    with pytest.raises(ValueError, match="unknown device wait kind"):
        device_stalls.measured_by_op([(1, "copy sideways", 0.1)])


def test_the_command_reads_the_last_step_and_a_given_timeline(tmp_path, capsys):
    waits = tmp_path / "waits.json"
    waits.write_text(json.dumps({"mode": "teraio-host", "steps": [
        {"step": 3, "time_s": 0.1, "device_stall_s": 0.0, "waits": []},
        {"step": 4, "time_s": 0.2, "device_stall_s": 0.02, "waits": [[5, "copy in", 0.02]]}]}))
    timeline = tmp_path / "t.json"
    timeline.write_text(json.dumps(TIMELINE))
    assert device_stalls.main([str(waits), "--timeline", str(timeline), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "step 4: 0.200 s, device stall 0.020 s" in out and "backward 2" in out
    assert json.loads((tmp_path / "r.json").read_text())["step"] == 4
    with pytest.raises(ValueError, match="no step 7"):
        device_stalls.load_waits(waits, 7)


def test_the_simulation_keeps_the_budget_as_the_runtime_does(monkeypatch):
    ran = []

    def fake_run(command, **kwargs):
        ran.append(command)
        path = pathlib.Path(command[command.index("--timeline") + 1])
        path.write_text(json.dumps(TIMELINE))

    monkeypatch.setattr(device_stalls.subprocess, "run", fake_run)
    assert device_stalls.simulate("teraio", "t.tiotrace", "p.json", ["--budget", "74GiB"]) == TIMELINE
    assert device_stalls.simulate("teraio", "t.tiotrace", "p.json", ["--enforce-budget"]) == TIMELINE
    assert ran[0][-3:] == ["--enforce-budget", "--budget", "74GiB"], ran[0]
    assert ran[1].count("--enforce-budget") == 1, ran[1]


def test_the_gpu_time_between_waits_is_set_against_the_profiles_operator_times():
    ops = device_stalls.simulated_ops(TIMELINE)
    # The GPU reaches op 1's wait at 0, waits 2 ms, runs ops 1-2 (20 ms in the profile) in 23 ms;
    # waits 4 ms at op 3, then runs ops 3-4 in 16.5 ms, 3.5 ms less than the profile.
    waits = [(1, "copy in", 0.002, "gated", 0.0), (3, "copy in", 0.004, "queued", 0.025),
             (5, "copy out", 0.001, "flushed", 0.0455)]
    report = device_stalls.between_waits(waits, ops)
    assert (report["first_op"], report["last_op"], report["intervals"]) == (1, 5, 2)
    assert report["gpu_s"] == pytest.approx(0.0395) and report["profiled_s"] == pytest.approx(0.040)
    assert report["excess_s"] == pytest.approx(-0.0005)
    assert report["excess_in_gaps_over_1ms_s"] == pytest.approx(0.003) and report["gaps_over_1ms"] == 1
    rows = {r["stretch"]: r for r in report["stretches"]}
    assert rows["forward 1"]["excess_s"] == pytest.approx(0.003)    # by the earlier wait's operator
    assert rows["backward 1"]["excess_s"] == pytest.approx(-0.0035)
    assert "optimizer 1" not in rows                                # no interval starts there
    assert report["worst"][0] == {"excess_s": pytest.approx(0.003), "from_op": 1, "to_op": 3, "names": ["aten::mm"]}
    text = device_stalls.between_text(report, min_s=0.001)
    assert text[0] == ("between the waits (ops 1-5, 2 intervals): GPU 0.039 s against the profile's 0.040 s, "
                       "-0.001 s; +0.003 s of it in 1 intervals over 1 ms beyond the profile")
    assert any(line.startswith("  forward 1") and line.endswith("+0.003 s") for line in text)
    assert text[-2:] == ["  ops 1-3 (aten::mm): +3.00 ms", "  ops 3-5 (aten::mm): -3.50 ms"]


def test_waits_without_their_gpu_times_give_no_comparison():
    ops = device_stalls.simulated_ops(TIMELINE)
    assert device_stalls.between_waits([(1, "copy in", 0.002, "gated"), (3, "copy in", 0.004, "queued")], ops) is None
    assert device_stalls.between_waits([(1, "copy in", 0.002, "gated", 0.0)], ops) is None
    assert device_stalls.between_text(None) == []


def test_a_wait_for_an_earlier_operator_is_skipped_and_counted():
    ops = device_stalls.simulated_ops(TIMELINE)
    waits = [(3, "copy in", 0.001, "gated", 0.0), (2, "copy in", 0.001, "gated", 0.002),
             (5, "copy in", 0.001, "gated", 0.030)]
    report = device_stalls.between_waits(waits, ops)
    assert report["out_of_order"] == 1 and report["intervals"] == 1
    assert report["profiled_s"] == pytest.approx(0.030)  # ops 2-4, from the second wait on
    assert "1 waits queued for an earlier operator" in "\n".join(device_stalls.between_text(report))


def test_the_command_sets_the_gpu_time_between_waits_against_the_profile(tmp_path, capsys):
    waits = tmp_path / "waits.json"
    waits.write_text(json.dumps({"mode": "teraio-host", "steps": [
        {"step": 4, "time_s": 0.2, "device_stall_s": 0.006, "waits": [[1, "copy in", 0.002, "gated", 0.0],
                                                                      [3, "copy in", 0.004, "queued", 0.025]]}]}))
    timeline = tmp_path / "t.json"
    timeline.write_text(json.dumps(TIMELINE))
    assert device_stalls.main([str(waits), "--timeline", str(timeline), "--json", str(tmp_path / "r.json")]) == 0
    assert "between the waits (ops 1-3, 1 intervals): GPU 0.023 s against the profile's 0.020 s" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["between_waits"]["excess_s"] == pytest.approx(0.003)


def test_copy_in_waits_are_split_by_the_simulated_slack_of_the_prefetches_due(tmp_path, capsys):
    def prefetch(deadline, start_ms, end_ms, tensor):
        return {"ph": "X", "pid": 1, "tid": 2, "cat": "migration", "name": f"prefetch {tensor}", "ts": start_ms * 1e3,
                "dur": (end_ms - start_ms) * 1e3, "args": {"deadline": deadline, "bytes": 1 << 20, "tensor": tensor}}

    # Op 1 (starts at 10 ms) has two prefetches due, the tighter landing 0.1 ms ahead; op 3 (35
    # ms) one landing 1 ms ahead; op 5 (55 ms) one landing 15 ms ahead. An offload does not count.
    timeline = {"traceEvents": TIMELINE["traceEvents"] + [
        prefetch(1, 0, 9.9, 6), prefetch(1, 0, 5, 8), prefetch(3, 20, 34, 9), prefetch(5, 30, 40, 7),
        {"ph": "X", "pid": 1, "tid": 2, "cat": "migration", "name": "offload 9", "ts": 0, "dur": 60e3,
         "args": {"deadline": 6, "bytes": 1 << 20}}]}
    ops = device_stalls.simulated_ops(timeline)
    assert [device_stalls.slack_band(s) for s in (-0.001, 0.0004, 0.0005, 0.009, 0.01)] == [
        "under 0.5 ms", "under 0.5 ms", "0.5-10 ms", "0.5-10 ms", "10 ms or more"]
    slack, by_tensor = device_stalls.prefetch_slack(timeline, ops)
    assert slack == {1: pytest.approx(0.0001), 3: pytest.approx(0.001), 5: pytest.approx(0.015)}
    assert by_tensor[(7, 5)] == (pytest.approx(0.015), 1 << 20)
    waits = [(1, "copy in", 0.002, "gated", 0.0), (3, "copy in", 0.004, "gated", 0.02),
             (5, "copy in", 0.003, "gated", 0.05), (5, "copy out", 0.009, "gated", 0.06),
             (6, "copy in", 0.001, "flushed", 0.07)]
    migrations = [{"direction": "prefetch", "deadline": 5, "bytes": 16 << 20},
                  {"direction": "offload", "deadline": 5, "bytes": 1 << 30}]
    report = device_stalls.by_slack(waits, slack, migrations)
    assert report["bands"] == {"under 0.5 ms": [1, pytest.approx(0.002)], "0.5-10 ms": [1, pytest.approx(0.004)],
                               "10 ms or more": [1, pytest.approx(0.003)],
                               "no prefetch due there": [1, pytest.approx(0.001)]}
    # Op 5's 3 ms wait is one the plan does not explain: 15 ms of slack, 16 MiB due.
    assert report["unexplained"] == 1 and report["unexplained_s"] == pytest.approx(0.003)
    assert report["worst"] == [{"op": 5, "waited_s": pytest.approx(0.003), "slack_s": pytest.approx(0.015),
                                "bytes_due": 16 << 20, "tensor": None}]
    assert device_stalls.slack_text(report)[-1] == "  op 5: waited 3.0 ms, simulated slack 15.0 ms, 16.0 MiB due"
    # A wait that names its tensor is set against that tensor's prefetch: op 1's wait for tensor
    # 8 (landed 5 ms ahead) is in the 0.5-10 ms band, not under 0.5 ms with op 1's tighter one.
    named = device_stalls.by_slack([(1, "copy in", 0.002, "gated", 0.0, 8), (1, "copy in", 0.001, "gated", 0.0, 99)],
                                   slack, by_tensor=by_tensor)
    assert named["bands"]["0.5-10 ms"] == [1, pytest.approx(0.002)]
    assert named["bands"]["under 0.5 ms"] == [1, pytest.approx(0.001)]  # tensor 99: not a prefetch due there
    # The command prints the split with a simulation.
    path = tmp_path / "waits.json"
    path.write_text(json.dumps({"steps": [{"step": 3, "time_s": 0.1, "device_stall_s": 0.019,
                                           "waits": [list(w) for w in waits]}]}))
    (tmp_path / "t.json").write_text(json.dumps(timeline))
    assert device_stalls.main([str(path), "--timeline", str(tmp_path / "t.json")]) == 0
    assert "waits over 1 ms for prefetches with 10 ms or more of slack: 1, 0.003 s" in capsys.readouterr().out
