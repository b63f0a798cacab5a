"""CPU smoke test of bench/train_llm.py, the end-to-end training benchmark: its tiny workload runs
every mode that works on a CPU in fresh processes, writes the table, and TeraIO's losses equal
ideal's bit for bit while it moves tensors to the SSD tier."""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

teraio = pytest.importorskip("teraio", reason="needs TeraIO's native module")

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "train_llm.py"
MODES = ["ideal", "teraio-ssd", "teraio-recompute", "recast", "ckpt", "save_on_cpu"]


def run_bench(*args):
    package_root = str(pathlib.Path(teraio.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_tiny_workload_runs_every_mode_and_teraio_is_exact(tmp_path, swap_dir):
    out = tmp_path / "out"
    # About a third of the tiny model's footprint: TeraIO must move tensors to the SSD tier.
    done = run_bench("--workload", "tiny", "--modes", ",".join(MODES), "--steps", "2", "--teraio-budget", "1MiB",
                     "--ssd-dir", str(swap_dir), "--ssd-capacity", "64MiB", "--out", str(out), "--plot",
                     "--recompute-tier", "ssd", "--recompute-counts", "2,0", "--recast-weights", "on", "--retime", "1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    table = json.loads((out / "tiny-nocap.json").read_text())
    markdown = (out / "tiny-nocap.md").read_text()
    assert markdown.count("\n| ") == len(MODES) + 1
    assert list(table["modes"]) == MODES
    for mode, entry in table["modes"].items():
        assert entry["status"] == "ok", (mode, entry["status"], entry.get("error_detail"))
        assert entry["summary"]["median_step_s"] > 0
    for mode in MODES[1:]:
        assert table["modes"][mode]["summary"]["exact"] is True, mode
    teraio_steps = table["modes"]["teraio-ssd"]["steps"]
    ideal_losses = [s["loss_hex"] for s in table["modes"]["ideal"]["steps"]]
    assert len(teraio_steps) == len(ideal_losses) + 1  # the step that retimed warms up in addition
    assert [s["loss_hex"] for s in teraio_steps][:len(ideal_losses)] == ideal_losses
    assert any(s["measured"] and s["bytes_to_ssd"] > 0 for s in teraio_steps)
    # A CPU session counts no host syncs (every tensor is on "the device" there), but records the field.
    assert all(s["host_syncs"] == 0 for s in teraio_steps)
    # --retime 1: the first planned step timed its operators and the session planned again;
    # that step is a warm-up one, and the notes say what the new times changed.
    assert [s["retimed"] for s in teraio_steps if s["phase"] == "planned"][0] is True
    assert not any(s["retimed"] for s in teraio_steps if s["measured"])
    assert not any(s.get("retimed") for s in table["modes"]["teraio-recompute"]["steps"] if s["measured"])
    assert "- teraio-ssd: planned again on the operator times of 1 planned step(s)" in markdown
    assert pathlib.Path(table["modes"]["teraio-ssd"]["teraio"]["timeline"]).is_file()
    # teraio-recompute tried both counts in training steps that stay exact, and says what it chose.
    recompute = table["modes"]["teraio-recompute"]["recompute"]
    assert [t["count"] for t in recompute["trials"]] == [2, 0] and recompute["count"] in (2, 0)
    # Back to 2 after trying 0: on its trial's plan when the session was planned, else profiled again.
    assert recompute["returned_by"] in (("its trial's plan kept", "profiled again") if recompute["count"] == 2 else ("",))
    tuned = table["modes"]["teraio-recompute"]["steps"]
    assert sum(not s["measured"] for s in tuned) == recompute["tuning_steps"] and sum(s["measured"] for s in tuned) == 2
    assert f"- teraio-recompute: recompute {recompute['count']} of 2 layers" in markdown
    assert "- host syncs in each micro-batch's forward (every mode): as the model makes them" in markdown
    # The tiny workload is fp32: recasting is on but has no weight copies to make again, and says so;
    # its GELU outputs are made again (teraio.remake, on by default), in the recast mode too.
    assert "- teraio-ssd: teraio.recast: 0 weight copies (0 B) kept as recipes, 0 cast again in backward; " in markdown
    for mode in ("teraio-ssd", "recast"):
        note = next(line for line in markdown.splitlines() if line.startswith(f"- {mode}: teraio.recast:"))
        remade = int(note.split("; ")[1].split(" activations")[0])
        assert remade > 0 and "made again in backward" in note, note
    # What held the host up: TeraIO's callbacks in its modes, Python's collector in every mode.
    assert all(s["callback_s"] > 0 for s in teraio_steps if s["measured"])
    # Its parts: the executor before and after each operator, and handing memory back, lie
    # inside the callbacks, and so do the allocations (mostly inside the executor's work).
    for s in (s for s in teraio_steps if s["measured"]):
        parts = s["callback_parts_s"]
        assert set(parts) == {"before_op", "after_op", "allocate", "hand_back"}, parts
        assert parts["before_op"] > 0 and parts["allocate"] > 0, parts
        assert parts["before_op"] + parts["after_op"] + parts["hand_back"] <= s["callback_s"], (parts, s["callback_s"])
        assert parts["allocate"] <= s["callback_s"], parts
        # before_op's own phases: retiring, issuing the plan's migrations, fetching, making room.
        phases = s["before_op_parts_s"]
        assert set(phases) == {"retire", "issue", "resident", "room"}, phases
        assert 0 < sum(phases.values()) <= parts["before_op"], (phases, parts)
        # A step that followed its plan looked only at the storages its profile saw freed, but for
        # an allocation retry (or full tiers, which the tiny workload's never are).
        if s["mode"] == "planned":
            assert s["freed_scans"] <= s["allocation_retries"], s
    assert "- teraio-ssd: TeraIO's operator callbacks took" in markdown
    # The host copier has no dispatcher to watch the link: no link activity, and no note on it.
    assert all(s["link"] is None for s in teraio_steps)
    assert "the PCIe link per measured step" not in markdown
    assert all(s["gc_s"] >= 0 and s["gc_collections"] >= 0 for e in table["modes"].values() for s in e["steps"]
               if s["measured"])
    assert "- ideal: Python's collector" in markdown
    # Which cuBLAS workspace set-up ran is said, for every mode (no cuBLAS on the CPU).
    assert {e["cublas_workspace"] for e in table["modes"].values()} == {"none (CPU)"}
    assert "- cuBLAS workspace (every mode): none (CPU)" in markdown
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "share_of_ideal.png").stat().st_size > 0


def test_reuse_blocks_reaches_the_session_and_its_counts_the_table(tmp_path, swap_dir):
    out = tmp_path / "out"
    done = run_bench("--workload", "tiny", "--modes", "ideal,teraio-ssd", "--steps", "2", "--teraio-budget", "1MiB",
                     "--ssd-dir", str(swap_dir), "--ssd-capacity", "64MiB", "--out", str(out), "--reuse-blocks", "on",
                     "--flush-sizes")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # The allocator's history is CUDA's: on the CPU the extra step is skipped, and says so.
    assert "--flush-sizes: skipped" in done.stdout
    entry = json.loads((out / "tiny-nocap.json").read_text())["modes"]["teraio-ssd"]
    assert entry["summary"]["exact"] is True
    planned = [s for s in entry["steps"] if s["phase"] == "planned"]
    assert planned and sum(s["blocks_reused"] for s in planned) > 0, [s["blocks_reused"] for s in planned]
    # No caching allocator on the CPU: no flush happens inside a fetch.
    assert all(s["fetch_flushes"] == 0 and s["fetch_flush_s"] == 0 for s in entry["steps"])
    assert "blocks reused" in done.stdout


def test_hole_reaches_the_session_and_its_counts_the_table(tmp_path, swap_dir):
    out = tmp_path / "out"
    done = run_bench("--workload", "tiny", "--modes", "ideal,teraio-ssd", "--steps", "2", "--teraio-budget", "1MiB",
                     "--ssd-dir", str(swap_dir), "--ssd-capacity", "64MiB", "--out", str(out), "--hole", "64KiB")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    entry = json.loads((out / "tiny-nocap.json").read_text())["modes"]["teraio-ssd"]
    assert entry["summary"]["exact"] is True
    planned = [s for s in entry["steps"] if s["phase"] == "planned"]
    assert planned and all(s["hole_opened"] > 0 and s["hole_taken"] > 0 for s in planned), planned
    assert "hole handed over" in done.stdout


def test_pcie_duplex_plan_latency_margin_and_lead_reach_the_planner_and_the_table_says_so(tmp_path, swap_dir):
    out = tmp_path / "out"
    done = run_bench("--workload", "tiny", "--modes", "ideal,teraio-ssd", "--steps", "2", "--teraio-budget", "1MiB",
                     "--ssd-dir", str(swap_dir), "--ssd-capacity", "64MiB", "--out", str(out),
                     "--pcie-duplex", "1.5GB/s", "--plan-latency", "2ms", "--plan-margin", "128KiB",
                     "--early-prefetch-lead", "7", "--plan-pcie", "2GB/s", "--min-migration-share", "0.001")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    entry = json.loads((out / "tiny-nocap.json").read_text())["modes"]["teraio-ssd"]
    assert entry["summary"]["exact"] is True
    assert "both at once 1.50 GB/s" in entry["teraio"]["plan"]["hardware"], entry["teraio"]["plan"]
    assert "teraio-ssd: planned for " in done.stdout and "both at once 1.50 GB/s" in done.stdout
    # The engine's first line, as it ran (on the CPU: the host copier, in issue order).
    assert "teraio-ssd: tier store (copier host" in done.stdout
    assert "2.00 ms a request" in entry["teraio"]["plan"]["hardware"], entry["teraio"]["plan"]
    assert entry["teraio"]["plan"]["plan_margin_bytes"] == 128 << 10
    assert "0.125 MiB kept free below the budget" in done.stdout
    assert entry["teraio"]["plan"]["early_prefetch_lead"] == 7
    assert "prefetches moved up to 7 transfer times earlier" in done.stdout
    assert entry["teraio"]["plan"]["min_migration_share"] == 0.001
    assert "storages under 1/1000 of the budget never planned to move" in done.stdout
    assert "PCIe d2h 2.00 GB/s h2d 2.00 GB/s" in entry["teraio"]["plan"]["hardware"], entry["teraio"]["plan"]


@pytest.mark.parametrize("time, says", [("2s", "time '2s': want 0 to 1 s"),
                                        ("soon", "time 'soon': ")])
def test_a_bad_plan_latency_is_refused(tmp_path, time, says):
    done = run_bench("--workload", "tiny", "--modes", "teraio-ssd", "--plan-latency", time, "--out", str(tmp_path))
    assert done.returncode == 2
    assert says in done.stderr, done.stderr


@pytest.mark.parametrize("option, value, says", [
    ("--pcie-duplex", "0", "--pcie-duplex '0': want a rate above 0"),
    ("--pcie-duplex", "fast", "rate 'fast': cannot parse bandwidth 'fast'"),
    ("--plan-latency", "2s", "time '2s': want 0 to 1 s"),
    ("--plan-latency", "soon", "time 'soon': "),
    ("--plan-margin", "wide", "wide"),
    ("--min-migration-share", "1", "--min-migration-share must be in [0, 1)"),
    ("--copy-chunk", "big", "big"),
    ("--paged-record", "on", "--paged-record is for --allocator paged"),
    ("--hold-copies", "on", "--hold-copies is for --allocator paged"),
    ("--hold-copies", "to-host", "--hold-copies is for --allocator paged"),
    ("--hold-copies", "in", "invalid choice: 'in'"),
])
def test_a_bad_link_model_is_refused(tmp_path, option, value, says):
    done = run_bench("--workload", "tiny", "--modes", "teraio-ssd", option, value, "--out", str(tmp_path))
    assert done.returncode == 2
    assert says in done.stderr, done.stderr


def test_unknown_mode_is_refused(tmp_path):
    done = run_bench("--workload", "tiny", "--modes", "ideal,zero3", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "unknown mode(s) zero3" in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed")
def test_llama_workload_without_transformers_says_why(tmp_path):
    done = run_bench("--workload", "W1", "--modes", "ideal", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "needs transformers" in done.stderr


def test_gpu_profile_splits_idle_compute_time_by_whether_a_copy_ran(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_profile

    def kernel(ts, dur, stream=7, correlation=0):
        return {"cat": "kernel", "name": "k", "ts": ts, "dur": dur,
                "args": {"stream": stream, "correlation": correlation}}

    def runtime(name, ts, dur, tid, correlation=None):
        args = {} if correlation is None else {"correlation": correlation}
        return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}

    def copy(ts, dur, kind, nbytes):
        return {"cat": "gpu_memcpy", "name": f"Memcpy {kind} (Device -> Pinned)", "ts": ts, "dur": dur,
                "args": {"stream": 9, "bytes": nbytes}}

    # Compute runs 0-100 and 300-400 and 1000-1100 us; a side stream's kernel does not count as
    # compute. A d2h copy covers 100-250 (idle 100-300 is half with a copy), an h2d copy 200-600
    # (so both run at once 200-250), and the idle 400-1000 has the h2d copy until 600.
    # The kernel ending the gap 100-300 was launched at 50, before it: the whole gap is a device
    # wait. The one ending the gap 400-1000 was launched at 900 by thread 1, which sat in
    # cudaEventSynchronize from 350 to 880: 500 us host late (480 of them in that call), 100 us
    # device wait. Thread 2's cudaMalloc did not hold up the launch.
    events = [kernel(0, 100), kernel(300, 100, correlation=2), kernel(1000, 100, correlation=3),
              kernel(0, 50, stream=3), copy(100, 150, "DtoH", 150_000), copy(200, 400, "HtoD", 800_000),
              runtime("cudaLaunchKernel", 50, 5, 1, correlation=2), runtime("cudaEventSynchronize", 350, 530, 1),
              runtime("cudaLaunchKernel", 900, 5, 1, correlation=3), runtime("cudaMalloc", 400, 500, 2)]
    # Thread 1 launched the kernel ending the late gap from aten::_fused_adamw_ inside the
    # optimizer's step (an earlier operator of that step ended before the launch).
    scope = lambda cat, name, ts, dur: {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": 1}  # noqa: E731
    events += [scope("user_annotation", "Optimizer.step#AdamW.step", 340, 700),
               scope("cpu_op", "aten::add_", 345, 5), scope("cpu_op", "aten::_fused_adamw_", 890, 20),
               scope("cpu_op", "aten::linear", 40, 20)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = gpu_profile.summarize_trace(str(path))
    assert s["compute_stream"] == 7
    assert s["gpu_span_s"] == pytest.approx(1100e-6)
    assert s["compute_busy_s"] == pytest.approx(300e-6)
    assert s["compute_idle_s"] == pytest.approx(800e-6)
    assert s["compute_idle_during_copies_s"] == pytest.approx((200 + 200) * 1e-6)
    assert s["compute_idle_without_copies_s"] == pytest.approx(400e-6)
    assert s["compute_gaps_over_100us"] == 2
    assert s["both_directions_s"] == pytest.approx(50e-6)
    assert s["d2h"]["busy_gbps"] == pytest.approx(1.0) and s["h2d"]["busy_gbps"] == pytest.approx(2.0)
    assert s["gaps_host_late_s"] == pytest.approx(500e-6)
    assert s["gaps_device_wait_s"] == pytest.approx(300e-6)
    assert s["gaps_host_late_in_runtime_calls_s"] == {"cudaEventSynchronize": pytest.approx(480e-6)}
    assert "while copies ran" in gpu_profile.describe(s)
    assert "host in cudaEventSynchronize 0.000 s" in gpu_profile.describe(s)
    assert s["gaps_host_late_by_outer_scope_s"] == {"Optimizer.step#AdamW.step": pytest.approx(500e-6)}
    assert s["gaps_host_late_by_inner_scope_s"] == {"aten::_fused_adamw_": pytest.approx(500e-6)}
    # While late (400-900), the thread was in the optimizer's step between its operators until
    # 890, then in aten::_fused_adamw_.
    assert s["gaps_host_late_during_scope_s"] == {"Optimizer.step#AdamW.step": pytest.approx(490e-6),
                                                  "aten::_fused_adamw_": pytest.approx(10e-6)}
    assert any("meanwhile: Optimizer.step#AdamW.step 0.000 s" in line for line in gpu_profile.late_scopes(s))
    # The device wait 100-300 ended as the d2h copy did (250, within 50 us), which had its
    # direction alone and had begun with the wait; no copy ended as the wait 900-1000 did.
    awaited = s["device_waits_awaited"]
    assert awaited["waits"] == 2 and awaited["by_direction_s"] == {"d2h": pytest.approx(200e-6)}
    assert awaited["link_alone_s"] == pytest.approx(200e-6) and awaited["link_shared_s"] == 0
    assert awaited["started_after_wait_began_s"] == 0 and awaited["unmatched_s"] == pytest.approx(100e-6)
    assert awaited["awaited_gbps"] == pytest.approx(1.0)
    assert "had it alone 0.000 s" in gpu_profile.awaited(s)

    # A wait of 100-1000 for an h2d copy on a side stream (400-990) that began only after the wait
    # did, beside a lane copy (300-800) that ran through 400 of its 590 us: the link was shared.
    events = [kernel(0, 100), kernel(1000, 100, correlation=5), runtime("cudaLaunchKernel", 20, 5, 1, correlation=5),
              {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 400, "dur": 590,
               "args": {"stream": 20, "bytes": 590_000}},
              {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 300, "dur": 500,
               "args": {"stream": 21, "bytes": 500_000}}]
    path.write_text(json.dumps({"traceEvents": events}))
    awaited = gpu_profile.summarize_trace(str(path))["device_waits_awaited"]
    assert awaited["by_direction_s"] == {"h2d": pytest.approx(900e-6)}
    assert awaited["link_shared_s"] == pytest.approx(900e-6) and awaited["link_alone_s"] == 0
    assert awaited["started_after_wait_began_s"] == pytest.approx(900e-6)
    assert any("Optimizer.step#AdamW.step 0.001 s" in line for line in gpu_profile.late_scopes(s))


@pytest.mark.skipif(not hasattr(__import__("torch.utils.checkpoint").utils.checkpoint,
                            "create_selective_checkpoint_contexts"),
                    reason="selective checkpointing needs PyTorch >= 2.4")
def test_selective_checkpointing_peer_runs_and_is_exact(tmp_path):
    out = tmp_path / "out"
    done = run_bench("--workload", "tiny", "--modes", "ideal,sac", "--steps", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    table = json.loads((out / "tiny-nocap.json").read_text())
    assert table["modes"]["sac"]["status"] == "ok", table["modes"]["sac"].get("error_detail")
    assert table["modes"]["sac"]["summary"]["exact"] is True


def test_host_syncs_off_skips_the_packed_sequence_check_where_it_is_looked_up(monkeypatch, tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    import types

    import llm_models

    def check(position_ids):
        return "packed"

    # The module whose _preprocess_mask_arguments looks the check up gets the replacement; one
    # that only imported the name (no _preprocess_mask_arguments) is left alone.
    masking = types.ModuleType("transformers.masking_utils")
    masking.find_packed_sequence_indices, masking._preprocess_mask_arguments = check, object()
    other = types.ModuleType("transformers.models.other")
    other.find_packed_sequence_indices = check
    package = types.ModuleType("transformers")
    package.masking_utils = masking
    for name, module in (("transformers", package), ("transformers.masking_utils", masking),
                         ("transformers.models.other", other)):
        monkeypatch.setitem(sys.modules, name, module)
    lm = llm_models.LanguageModel(module=None, description="", blocks=None, uses_transformers=True)
    import torch

    done = llm_models.without_host_syncs(lm, torch.device("cuda"))
    assert lm.pinned_inputs
    assert done == ("inputs copied from pinned memory without waiting; transformers' packed-sequence check "
                    "skipped (transformers.masking_utils)")
    assert masking.find_packed_sequence_indices(None) is None and other.find_packed_sequence_indices is check
    # On the CPU the inputs stay where they are; the pinned copy is only for CUDA.
    cpu_run = run_bench("--workload", "tiny", "--modes", "ideal,ckpt", "--steps", "2", "--host-syncs", "off",
                        "--out", str(tmp_path / "out"))
    assert cpu_run.returncode == 0, cpu_run.stdout[-4000:] + cpu_run.stderr[-4000:]
    table = json.loads((tmp_path / "out" / "tiny-nocap.json").read_text())
    assert [entry["host_syncs"] for entry in table["modes"].values()] == ["inputs on the CPU"] * 2
    assert table["modes"]["ckpt"]["summary"]["exact"] is True
    cpu = llm_models.LanguageModel(module=None, description="", blocks=None, uses_transformers=False)
    assert llm_models.without_host_syncs(cpu, torch.device("cpu")) == "inputs on the CPU"
    assert cpu._to(torch.ones(2), torch.device("cpu")).device.type == "cpu"


def test_gc_freeze_is_recorded_and_changes_no_loss(tmp_path):
    # --gc-freeze on freezes the collector's objects in every mode, says so, and computes the same
    # losses bit for bit as a run without it (TeraIO's session too).
    common = ("--workload", "tiny", "--modes", "ideal,teraio-host", "--steps", "2", "--teraio-budget", "1MiB")
    tables = {}
    for freeze in ("on", "off"):
        done = run_bench(*common, "--gc-freeze", freeze, "--out", str(tmp_path / freeze))
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        tables[freeze] = json.loads((tmp_path / freeze / "tiny-nocap.json").read_text())
    for name, entry in tables["on"]["modes"].items():
        counts = re.fullmatch(r"gc\.freeze\(\): (\d+) objects frozen after setup, (\d+) in all before the first "
                              r"measured step", entry["gc_freeze"])
        assert counts and 0 < int(counts[1]) <= int(counts[2]), entry["gc_freeze"]
        assert "gc_freeze" not in tables["off"]["modes"][name]
        losses = [[step["loss_hex"] for step in table["modes"][name]["steps"]] for table in tables.values()]
        assert losses[0] == losses[1] and len(losses[0]) >= 2
    assert tables["on"]["modes"]["teraio-host"]["summary"]["exact"] is True
    assert "Python's collector, gc.freeze()" in (tmp_path / "on" / "tiny-nocap.md").read_text()


def test_freeze_collector_freezes_and_unfreeze_undoes_it():
    sys.path.insert(0, str(SCRIPT.parent))
    import gc

    import host_watch

    kept = [[] for _ in range(10)]  # tracked objects alive across the freeze
    try:
        frozen = host_watch.freeze_collector()
        assert frozen == gc.get_freeze_count() and frozen >= len(kept)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_gpu_profile_scopes_nest_by_parent():
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_profile

    def op(name, start, end):
        return {"cat": "cpu_op", "name": name, "ts": start, "dur": end - start, "tid": 1}

    # A child whose end is rounded past its parent's still nests, and so does a later sibling.
    scopes = gpu_profile._Scopes([op("P", 0, 100), op("C", 10, 100.001), op("S", 95, 99)])
    assert scopes.at(1, 97) == ("P", "S")
    assert scopes.at(1, 99.5) == ("P", "C")
    assert scopes.at(1, 200) is None and scopes.at(2, 50) is None
    # Between the 30,000 operators of one long scope, the long scope is found (no search limit).
    scopes = gpu_profile._Scopes([op("Optimizer.step", 0, 10**6)] + [op("aten::mul", 10 * i + 1, 10 * i + 5)
                                                                      for i in range(30000)])
    assert scopes.at(1, 299998) == ("Optimizer.step", "Optimizer.step")
    assert scopes.at(1, 3) == ("Optimizer.step", "aten::mul")


def test_flush_sizes_names_the_request_after_each_run_of_unmaps():
    sys.path.insert(0, str(SCRIPT.parent))
    import flush_sizes

    mib = 1 << 20
    head = [{"filename": "/x/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
            {"filename": "/site/transformers/models/llama/modeling_llama.py", "line": 7, "name": "forward"},
            {"filename": "/w/bench/train_llm.py", "line": 9, "name": "loss"}]
    trace = [
        {"action": "alloc", "size": 2 * mib, "frames": head},  # no flush before it
        {"action": "segment_unmap", "size": 20 * mib}, {"action": "segment_unmap", "size": 40 * mib},
        {"action": "segment_map", "size": 1024 * mib},
        {"action": "alloc", "size": 1024 * mib, "frames": head},
        {"action": "free_requested", "size": 1024 * mib},
        {"action": "segment_unmap", "size": 2 * mib},
        {"action": "alloc", "size": 1024 * mib, "frames": head},
        {"action": "segment_unmap", "size": 2 * mib},
        {"action": "alloc", "size": 32 * mib, "frames": []},
        {"action": "free_requested", "size": 32 * mib},
        {"action": "segment_unmap", "size": 8 * mib},  # emptied, then a free: no request's flush
        {"action": "free_completed", "size": 32 * mib},
        {"action": "alloc", "size": 1024 * mib, "frames": head},
        {"action": "segment_free", "size": 64 * mib},  # the classic allocator's flush
        {"action": "segment_alloc", "size": 512 * mib},
        {"action": "oom", "size": 512 * mib},
        {"action": "segment_unmap", "size": 2 * mib},  # the step ended inside a flush
    ]
    s = flush_sizes.summarize(trace)
    assert s["flushes"] == 4 and s["unmaps"] == 5 and s["unmapped_bytes"] == 128 * mib
    assert s["emptied"] == 1
    assert s["allocs"] == 5 and s["allocs_256mib_or_more"] == 3 and s["flushes_for_256mib_or_more"] == 3
    assert {"size": 512 * mib, "site": "(out of memory)", "flushes": 1} in s["by_request"]
    assert s["unfinished"] is True
    top = s["by_request"][0]
    assert top == {"size": 1024 * mib, "flushes": 2,
                   "site": "llama/modeling_llama.py:7 forward < bench/train_llm.py:9 loss"}
    assert s["by_request"][1]["site"].startswith("(no Python frame")
    lines = flush_sizes.describe(s)
    assert lines[0].startswith("4 flushes in the recorded step (5 unmaps, 0.1 GiB unmapped); 3 of them")
    assert lines[0].endswith("; caches emptied outside an allocation: 1")
    assert lines[1] == "  the step ended inside a run of unmaps (not counted)"
    assert "1024.0 MiB" in lines[2]


def test_on_cuda_flush_sizes_reads_the_allocators_history():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("the allocator's history is CUDA's")
    sys.path.insert(0, str(SCRIPT.parent))
    import flush_sizes

    device = torch.device("cuda", torch.cuda.current_device())

    def one_step():
        dropped = torch.empty(96 << 20, dtype=torch.uint8, device=device)
        del dropped
        torch.cuda.empty_cache()  # the same events as a flush at the limit
        kept = torch.empty(96 << 20, dtype=torch.uint8, device=device)  # the request after it
        return lambda: None  # nothing to note

    s = flush_sizes.record_one_step(one_step, device)
    assert s["flushes"] >= 1 and s["unmapped_bytes"] >= 96 << 20, s
    assert s["alloc_retries"] == 0 and s["history_full"] is False  # emptied by hand, no retry
    assert any(row["size"] == 96 << 20 and "test_bench_train_llm.py" in row["site"] for row in s["by_request"]), s


def test_a_count_tried_twice_saves_both_profiles_and_goes_back_to_the_faster(tmp_path, swap_dir):
    out = tmp_path / "out"
    done = run_bench("--workload", "tiny", "--modes", "teraio-recompute", "--steps", "2", "--teraio-budget", "1MiB",
                     "--ssd-dir", str(swap_dir), "--ssd-capacity", "64MiB", "--out", str(out),
                     "--recompute-tier", "ssd", "--recompute-counts", "2,0,2", "--save-trace", "--stall-rounds", "0")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # The notes say how many rounds the stall search ran (here none: the tiny plan fits without
    # waits, whatever the cap; tests/python/test_recompute.py checks the cap itself).
    assert "; stall search: 0 round(s)" in (out / "tiny-nocap.md").read_text()
    assert json.loads((out / "tiny-nocap.json").read_text())["args"]["stall_rounds"] == 0
    # Both profiles of 2 recomputed layers, each with its plan, beside the one of 0.
    for name in ("c2", "c0", "c2-2"):
        assert (out / f"tiny-nocap-teraio-recompute-{name}-trace.tiotrace").is_file(), name
        assert list(out.glob(f"tiny-nocap-teraio-recompute-{name}-plan.*")), name
    # Each measured step's device waits (none on a CPU: the host copier's copies are done when
    # they return), for bench/device_stalls.py.
    waits = json.loads((out / "tiny-nocap-teraio-recompute-device-waits.json").read_text())
    assert [(s["waits"], s["device_stall_s"]) for s in waits["steps"]] == [([], 0.0)] * 2, waits
    recompute = json.loads((out / "tiny-nocap.json").read_text())["modes"]["teraio-recompute"]["recompute"]
    trials = recompute["trials"]
    assert [t["count"] for t in trials] == [2, 0, 2]
    fastest = min(trials, key=lambda t: t["step_s"])
    # The last trial chosen: nothing to go back to; else back on the chosen trial's own plan.
    assert recompute["returned_by"] == ("" if fastest is trials[2] else "its trial's plan kept"), recompute


def test_a_step_line_says_how_many_offloads_were_taken_back_and_what_was_not_copied(capsys):
    sys.path.insert(0, str(SCRIPT.parent))
    import types

    import train_llm

    record = {"step": 3, "measured": True, "time_s": 22.8, "loss": 12.5, "phase": "planned", "mode": "planned",
              "stall_s": 1.0, "bytes_to_host": 1 << 30, "bytes_to_ssd": 0, "demand_fetches": 5,
              "cancelled_offloads": 3, "bytes_abandoned": 96 << 20}
    train_llm.print_step(types.SimpleNamespace(workload="W3"), "teraio-recompute", record, 6)
    assert "taken back 3 (96.00 MiB not copied)" in capsys.readouterr().out
    record["cancelled_offloads"] = 0
    train_llm.print_step(types.SimpleNamespace(workload="W3"), "teraio-recompute", record, 6)
    assert "taken back" not in capsys.readouterr().out


def test_a_step_line_says_what_was_positioned_and_evicted(capsys):
    sys.path.insert(0, str(SCRIPT.parent))
    import types

    import train_llm

    record = {"step": 2, "measured": True, "time_s": 26.5, "loss": 12.5, "phase": "planned", "mode": "planned",
              "stall_s": 0.0, "bytes_to_host": 1 << 30, "bytes_to_ssd": 0, "demand_fetches": 11, "evictions": 11,
              "positioned": 370, "positioned_back": 111}
    train_llm.print_step(types.SimpleNamespace(workload="W3"), "teraio-recompute", record, 4)
    out = capsys.readouterr().out
    assert "positioned 370 out 111 back demand 11 evictions 11" in out
    assert "late frees" not in out
    record["late_free_evictions"] = 9
    train_llm.print_step(types.SimpleNamespace(workload="W3"), "teraio-recompute", record, 4)
    assert "evictions 11 (9 for late frees)" in capsys.readouterr().out
    record.update(positioned=0, positioned_back=0, evictions=0)
    train_llm.print_step(types.SimpleNamespace(workload="W3"), "teraio-recompute", record, 4)
    out = capsys.readouterr().out
    assert "positioned" not in out and "evictions" not in out


def test_copy_chunk_reaches_the_session_which_refuses_one_out_of_bounds(tmp_path, swap_dir):
    # The CPU's host copier has no lanes; the bound is TeraIO's, said in the mode's row.
    done = run_bench("--workload", "tiny", "--modes", "teraio-ssd", "--steps", "2", "--teraio-budget", "1MiB",
                     "--ssd-dir", str(swap_dir), "--ssd-capacity", "64MiB", "--copy-chunk", "1KiB",
                     "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    entry = json.loads((tmp_path / "tiny-nocap.json").read_text())["modes"]["teraio-ssd"]
    assert "a copy lane's chunk must be a multiple of 4 KiB" in entry["status"], entry["status"]


def test_holding_copies_needs_a_deadline_copy_order(tmp_path):
    done = run_bench("--workload", "tiny", "--modes", "teraio-ssd", "--allocator", "paged", "--hold-copies", "on",
                     "--copy-order", "issue", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "--hold-copies needs a deadline --copy-order" in done.stderr, done.stderr
