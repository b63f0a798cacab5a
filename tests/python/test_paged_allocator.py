"""teraio.paged: TeraIO's paged device memory as PyTorch's CUDA allocator. On CUDA each case runs
in a fresh process, since PyTorch swaps its allocator only before CUDA serves a tensor: blocks
freed in a scattered pattern serve a request longer than any of them without running out,
a block recorded on a busy stream is not handed out again, the cap gives PyTorch's own
out-of-memory error, and training under a TeraIO session is bit-identical to training under the
caching allocator without TeraIO, with the session's copies held for the allocator's driver calls
too (hold_copies_to_map), which a session without the allocator or in issue order refuses; a
close() that finds no room on the device says so and leaves the session open, training on exactly."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import teraio
from conftest import requires_cuda

HERE = pathlib.Path(__file__).resolve().parent
MIB = 1 << 20


def run_fresh(code: str, *args: str) -> dict:
    """Runs `code` in a fresh interpreter with the paged allocator installed first; the code
    sets `result`, returned as JSON."""
    package_root = str(pathlib.Path(teraio.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, str(HERE),
                                                                     os.environ.get("PYTHONPATH")]))}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    script = "import json, sys, torch, teraio\nresult = {}\n" + textwrap.dedent(code) + \
        "\nprint('RESULT ' + json.dumps(result))\n"
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.skipif(teraio.build["torch_cuda"], reason="this binding has CUDA")
def test_without_cuda_installing_says_why():
    assert teraio.paged.stats() is None and not teraio.paged.installed()
    with pytest.raises(teraio.Error) as refused:
        teraio.paged.install(page_bytes="32MiB")
    assert refused.value.kind == "unsupported"
    assert "needs a CUDA build" in str(refused.value)


@requires_cuda
def test_installing_after_cuda_started_is_refused_with_the_reason():
    result = run_fresh("""
        torch.ones(1, device="cuda")
        try:
            teraio.paged.install()
        except teraio.Error as e:
            result.update(kind=e.kind, message=str(e))
    """)
    assert result["kind"] == "invalid argument", result
    assert "before any CUDA work" in result["message"]


@requires_cuda
def test_scattered_free_blocks_serve_a_longer_request_under_the_cap():
    result = run_fresh("""
        teraio.paged.install()
        torch.cuda.set_per_process_memory_fraction((1 << 30) / torch.cuda.get_device_properties(0).total_memory)
        MIB = 1 << 20
        blocks = [torch.empty(100 * MIB, dtype=torch.uint8, device="cuda") for _ in range(9)]
        del blocks[::2]  # five freed blocks of 100 MiB between four kept ones
        long = torch.empty(450 * MIB, dtype=torch.uint8, device="cuda")
        long.fill_(7)
        result["sum"] = int(long[::MIB].sum())
        result["stats"] = teraio.paged.stats()
        try:
            torch.empty(600 * MIB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            result["oom"] = str(e)
    """)
    stats = result["stats"]
    assert result["sum"] == 7 * 450
    assert stats["taken_blocks"] >= 3 and stats["out_of_memory"] == 0, stats
    assert stats["held_bytes"] <= 1 << 30 and stats["cap_bytes"] <= 1 << 30, stats
    assert "TeraIO paged allocator" in result["oom"]


@requires_cuda
def test_a_block_recorded_on_a_busy_stream_is_not_handed_out_again():
    result = run_fresh("""
        teraio.paged.install()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # kernels loaded first: a first launch waits for the stream
            warm = torch.randn(64, 64, device="cuda")
            (warm @ warm / 64).add_(1)
        side.synchronize()
        torch.empty(0, device="cuda").record_stream(side)  # PyTorch records empty tensors too: ignored
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        before = x.data_ptr()
        with torch.cuda.stream(side):
            a = torch.randn(4096, 4096, device="cuda")
            for _ in range(400):  # a side stream busy for about a second with real work
                a = a @ a / 64
            x.add_(1)
        x.record_stream(side)
        del x
        y = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        result["same_while_busy"] = y.data_ptr() == before
        result["side_busy"] = not side.query()
        result["stats_then"] = teraio.paged.stats()
        side.synchronize()
        del y
        z = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        result["stats"] = teraio.paged.stats()
    """)
    assert result["side_busy"], "the side stream finished too early for the test to say anything"
    assert result["stats_then"]["recorded_uses"] == 1, result
    assert result["same_while_busy"] is False, result


EXACT = """
    import test_training_exact as t
    held = sys.argv[1].removeprefix("held:") if sys.argv[1].startswith("held:") else None
    paged = sys.argv[1] == "paged" or held is not None
    if paged:
        teraio.paged.install()
    want = t.reference(t.gpt, t.adamw, "cuda")
    result["losses"] = [w.item().hex() for w in want.losses]
    if paged:
        kwargs = t.budget_kwargs(t.gpt, t.adamw, "cuda", sys.argv[2])
        build = t.gpt
        if held is not None:
            try:
                teraio.Session(**{**kwargs, "copy_order": "issue", "hold_copies_to_map": held})
            except teraio.Error as e:
                result["issue_order"] = str(e)
            kwargs["hold_copies_to_map"] = held
            # This model's tensors all fit the allocator's small chunks, kept in slabs that
            # empty_cache leaves mapped, and the reference above mapped all it needs (session 44's
            # GPU run: no hold; session 45's, with the cache emptied: only empty_cache's own).
            # So the last block asks for pages of its own, unused, in each forward (as offloads
            # of the earlier ones are under way), and each step empties the cache, so that the
            # request maps again in the next step, under a hold.
            page = teraio.paged.stats()["page_bytes"]
            def gpt_that_maps():
                model = t.gpt()
                def ask_for_pages(*_):
                    torch.empty(2 * page, dtype=torch.uint8, device="cuda")
                model.blocks[-1].register_forward_hook(ask_for_pages)
                return model
            step = t.train_step
            def train_step_then_empty(*args):
                losses = step(*args)
                torch.cuda.empty_cache()
                return losses
            t.train_step = train_step_then_empty
            build = gpt_that_maps
        got = t.train(build, t.adamw, t.STEPS, "cuda", session_kwargs=kwargs)
        t.assert_exact(want, got)
        result["moved"] = sum(s["bytes_offloaded"] for s in got.report["steps"])
        result["stats"] = teraio.paged.stats()
        result["link_holds"] = [{way: s["link"][way]["holds"] for way in ("to_host", "to_device")}
                                for s in got.report["steps"] if s.get("link")]
"""


@pytest.fixture(scope="module")
def caching(tmp_path_factory):
    """The reference: the same training under the caching allocator without TeraIO, run once for
    the exactness cases below (a fresh process on the GPU; it writes no swap file)."""
    return run_fresh(EXACT, "caching", str(tmp_path_factory.mktemp("unused-swap")))


@requires_cuda
def test_training_under_a_session_is_exact_against_the_caching_allocator_without_teraio(caching, swap_dir):
    paged = run_fresh(EXACT, "paged", str(swap_dir))
    assert paged["losses"] == caching["losses"]
    assert paged["moved"] > 0
    assert paged["stats"]["allocations"] > 0 and paged["stats"]["out_of_memory"] == 0
    assert paged["stats"]["copy_holds"] == 0


@requires_cuda
@pytest.mark.parametrize("copies", ["both", "to_host"])
def test_training_with_copies_held_for_the_driver_calls_is_exact_too(caching, swap_dir, copies):
    held = run_fresh(EXACT, "held:" + copies, str(swap_dir))
    assert held["losses"] == caching["losses"]
    assert held["moved"] > 0
    # empty_cache takes a hold of its own each step: more holds than that are requests that mapped.
    assert held["stats"]["copy_holds"] > held["stats"]["emptied"] > 0, held["stats"]
    to_host = sum(s["to_host"] for s in held["link_holds"])
    to_device = sum(s["to_device"] for s in held["link_holds"])
    assert to_host > 0, held["link_holds"]
    assert (to_device > 0) == (copies == "both"), held["link_holds"]  # the lane into the device went on?
    assert "needs a CUDA copier in a deadline order" in held["issue_order"], held


CLOSE_WITHOUT_ROOM = """
    import test_training_exact as t
    teraio.paged.install()
    want = t.reference(t.gpt, t.adamw, "cuda")
    kwargs = t.budget_kwargs(t.gpt, t.adamw, "cuda", sys.argv[1])
    torch.manual_seed(0)  # as t.train does
    model = t.gpt().to("cuda")
    optimizer = t.adamw(model.parameters())
    data = t.batches(model.config, t.STEPS, 0)
    session = teraio.Session(device="cuda", **kwargs)
    losses = []
    def steps(first, end):
        for step in range(first, end):
            with session.step():
                losses.extend(t.train_step(model, optimizer, data[step:step + 1], "cuda"))
    steps(0, 5)
    result["away"] = session.report()["steps"][-1]["bytes_offloaded"]
    # The device made full: the cap a page over what is held, then requests of every size class
    # until none is served, so that no tensor close() brings back finds room.
    stats = teraio.paged.stats()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((stats["held_bytes"] + stats["page_bytes"]) / total)
    filler = []
    for size in [1 << k for k in range(9, 26)]:
        try:
            while True:
                filler.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
    try:
        session.close()
        result["closed_without_room"] = True
    except teraio.Error as e:
        result["kind"], result["message"] = e.kind, str(e)
    result["phase_after"] = session.phase
    del filler
    torch.cuda.set_per_process_memory_fraction(1.0)
    steps(5, t.STEPS)  # training goes on under the session, and a later close() succeeds
    session.close()
    result["phase"] = session.phase
    result["exact"] = [w.item().hex() for w in want.losses] == [g.item().hex() for g in losses]
    result["params_exact"] = all(torch.equal(w, g) for w, g in
                                 zip(want.params.values(), t.snapshot_params(model).values()))
"""


@requires_cuda
def test_a_close_without_room_on_the_device_says_so_and_leaves_the_session_open(swap_dir):
    result = run_fresh(CLOSE_WITHOUT_ROOM, str(swap_dir))
    assert result["away"] > 0, result
    assert "closed_without_room" not in result, result
    assert result["kind"] == "out of device memory", result
    message = result["message"]
    assert "session.close() brings every tensor the session moved off cuda:0 back" in message, message
    assert "The device has no room for every tensor still alive" in message, message
    assert result["phase_after"] == "planned" and result["phase"] == "closed", result
    assert result["exact"] and result["params_exact"], result


@pytest.mark.parametrize("held", [True, "both", "to_host", "to-host"])
def test_holding_copies_without_the_paged_allocator_is_refused(held):
    if teraio.paged.installed():
        pytest.skip("the paged allocator is installed in this process")
    with pytest.raises(teraio.Error, match="paged allocator, which is not installed"):
        teraio.Session(gpu_budget="1GiB", device="cpu", hold_copies_to_map=held)


@pytest.mark.parametrize("held", ["to_device", "out", 1])
def test_copies_to_hold_are_both_or_those_to_the_host(held):
    with pytest.raises(ValueError, match="hold_copies_to_map must be False, True, 'both' or 'to_host'"):
        teraio.Session(gpu_budget="1GiB", device="cpu", hold_copies_to_map=held)


def test_the_bench_refuses_caching_allocator_options_with_the_paged_one(tmp_path):
    script = HERE.parents[1] / "bench" / "train_llm.py"
    package_root = str(pathlib.Path(teraio.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), "--workload", "tiny", "--modes", "ideal", "--allocator", "paged",
                           "--flush-sizes", "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2
    assert "--allocator paged replaces it" in done.stderr
    done = subprocess.run([sys.executable, str(script), "--workload", "tiny", "--modes", "ideal", "--paged-page", "32MiB",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "--paged-page is for --allocator paged" in done.stderr


def test_recording_without_the_allocator_installed_is_refused():
    if teraio.paged.installed():
        pytest.skip("the paged allocator is installed in this process")
    for call in (teraio.paged.start_recording, teraio.paged.mark_step,
                 lambda: teraio.paged.save_recording("unused.txt")):
        with pytest.raises(teraio.Error, match="paged allocator is not installed"):
            call()


@requires_cuda
def test_a_recording_of_real_requests_replays_step_by_step(tmp_path):
    # Two steps of the same requests: the second serves each block in place, as the allocator did.
    path = tmp_path / "requests.txt"
    result = run_fresh("""
        teraio.paged.install(page_bytes="2MiB")
        keep = torch.ones(1, device="cuda")
        teraio.paged.start_recording()
        for step in range(2):
            blocks = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (3, 5, 9)]
            del blocks
            teraio.paged.mark_step()
        result["requests"] = teraio.paged.save_recording(sys.argv[1])
        result["again"] = teraio.paged.save_recording(sys.argv[1] + ".none")
    """, str(path))
    assert result["again"] is None
    # At least the live block, then a step's 3 allocations, 3 frees and its mark, twice.
    assert result["requests"] >= 1 + 2 * (3 + 3 + 1), result
    # The CLI of this checkout's build: build/release here, build/gpu on the GPU machine.
    root = pathlib.Path(__file__).resolve().parents[2]
    built = [root / "build" / name / "tools" / "teraio" / "teraio" for name in ("gpu", "release")]
    cli = next((path for path in built if path.exists()), None)
    if cli is None:
        pytest.skip(f"the teraio CLI is built at none of {[str(path) for path in built]}")
    done = subprocess.run([str(cli), "paged-replay", str(path), "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)["steps"]
    assert len(steps) == 2
    assert steps[0]["pages_mapped"] >= 9 and steps[1]["pages_mapped"] == 0, steps
    assert steps[1]["reused"] == 3, steps
