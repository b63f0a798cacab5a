#!/usr/bin/env python3
"""End-to-end training benchmark (issue 5): TeraIO against ideal and the PyTorch-native ways of
training under a GPU memory budget, on the workloads W1, W2, W3 of shared/WORKLOADS.md.

For each mode it measures the median step time over the measured steps, the share of ideal
(ideal's median / the mode's median), peak GPU memory (allocated and reserved), peak pinned host
memory, bytes moved per tier per step, stall time per step, TeraIO's predicted step time for its
plan (and that model's error), and whether every loss equals ideal's bit for bit.

Every mode runs in a fresh process (this script, re-invoked with --child MODE), so none inherits
another's caching allocator, pinned memory or CUDA context; a child that fails, runs out of memory
or hangs is reported in the table and the others still run. A budget is emulated with
torch.cuda.set_per_process_memory_fraction(budget / total) for every mode but ideal; TeraIO's
gpu_budget is the budget less --reserve (memory TeraIO does not track: cuBLAS workspace,
allocator slack). Writes OUT/<workload>-<budget>.json and .md, prints the table.

On the GPU machine (one H100; the native module built; transformers and matplotlib installed),
from the repository root, one workload and budget per command:
  python3 bench/train_llm.py --workload W1 --budget 24GiB --out out/train_llm \\
      --modes ideal,teraio-host,teraio-ssd,teraio-mixed,ckpt,save_on_cpu,fsdp2-offload
  python3 bench/train_llm.py --workload W2 --budget 16GiB --out out/train_llm --steps 3
  python3 bench/train_llm.py --workload W3 --budget 79GiB --extrapolate 2,4,6 --out out/train_llm \\
      --modes ideal,teraio-host,teraio-mixed,fsdp2-offload
  python3 bench/train_llm.py --plot-from out/train_llm      # share-of-ideal bar chart of every table there
A quick check on a CPU (no transformers needed: the tiny workload falls back to teraio.models.gpt):
  python3 bench/train_llm.py --workload tiny --teraio-budget 1MiB --ssd-dir /tmp/swap --ssd-capacity 64MiB \\
      --modes ideal,teraio-ssd,ckpt,save_on_cpu --out /tmp/train_llm
"""

import argparse
import collections
import contextlib
import dataclasses
import datetime
import functools
import gc
import importlib.util
import json
import math
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time
import traceback

if "--no-deterministic" not in sys.argv:
    # cuBLAS picks its reduction order by workspace: a fixed workspace makes it repeatable. It must
    # be set before CUDA starts; use_deterministic_algorithms refuses cuBLAS without it.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

if importlib.util.find_spec("teraio") is None:
    sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import flush_sizes  # noqa: E402  (bench/flush_sizes.py)
import gpu_profile  # noqa: E402  (bench/gpu_profile.py)
import host_watch  # noqa: E402  (bench/host_watch.py)
import link_activity  # noqa: E402  (bench/link_activity.py)
import repeated_kv  # noqa: E402  (bench/repeated_kv.py)
from llm_models import (  # noqa: E402  (bench/llm_models.py)
    STATE_BYTES_PER_PARAM, WORKLOADS, batch_stream, build_model, count_parameters, describe_model,
    enable_checkpointing, enable_selective_checkpointing, make_optimizer, shard_with_cpu_offload,
    single_process_group, transformers_available, without_host_syncs)
from llm_table import (  # noqa: E402  (bench/llm_table.py)
    extrapolate_ideal, fmt_size, median_of, plot_dir, summarize, table_heading, table_markdown, table_notes)

SCRIPT = pathlib.Path(__file__).resolve()

MODES = {
    "ideal": "no memory cap",
    "teraio-host": "TeraIO, host tier only (--host-budget)",
    "teraio-ssd": "TeraIO, SSD tier only (--ssd-dir, --ssd-capacity)",
    "teraio-mixed": "TeraIO, host tier capped (--mixed-host-budget) and SSD tier",
    "teraio-recompute": "TeraIO (tiers of --recompute-tier, default host) recomputing the last decoder layers, "
                        "how many chosen by teraio.recompute.tune (--recompute-counts)",
    "recast": "teraio.recast alone, no session: weight copies and cheap activations (teraio.remake) made again "
              "in the backward pass instead of kept, as --recast-weights and --recast-activations say; nothing "
              "offloaded",
    "ckpt": "activation checkpointing of every decoder layer (use_reentrant=False)",
    "sac": "selective activation checkpointing of every decoder layer: torch.utils.checkpoint's selective "
           "checkpointing keeping matrix products and attention, recomputing the rest (PyTorch >= 2.4)",
    "save_on_cpu": "torch.autograd.graph.save_on_cpu(pin_memory=True) around forward and backward",
    "fsdp2-offload": "FSDP2 fully_shard with CPUOffloadPolicy(pin_memory=True), one process",
}
# Modes that keep every model state (parameters, gradients, two AdamW states) on the GPU.
STATES_ON_GPU = ("ideal", "recast", "ckpt", "sac", "save_on_cpu")
STEP_FIELDS = ("phase", "mode", "stall_s", "bytes_to_host", "bytes_from_host", "bytes_to_ssd", "bytes_from_ssd",
               "demand_fetches", "evictions", "peak_resident")
# Reported by newer native builds only (device-side waits): recorded when present.
OPTIONAL_STEP_FIELDS = ("device_stall_s", "device_waits", "blocks_reused", "fetch_flushes", "fetch_flush_s",
                        "hole_opened", "hole_taken", "hole_take_flushes",
                        "allocation_retries", "stall_by_cause_s",
                        "callback_s", "callback_parts_s", "before_op_parts_s", "freed_scans", "freed_scan_s",
                        "dropped", "bytes_dropped", "copies_given_up", "retimed", "cancelled_offloads", "bytes_abandoned",
                        "link", "positioned", "positioned_back", "late_free_evictions", "host_syncs",
                        "first_host_sync")
# --hold-copies as Session(hold_copies_to_map=...).
HELD_COPIES = {"off": False, "on": "both", "to-host": "to_host"}
PLAN_PREDICTIONS = ("predicted_step_s", "predicted_stall_s", "bound_step_s", "profiled_step_s")


# ---------------------------------------------------------------------------------------------
# Command line


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=list(WORKLOADS), help="workload of shared/WORKLOADS.md, or tiny (CPU test)")
    p.add_argument("--budget", help="GPU memory cap, e.g. 24GiB (default: none); bytes without the native module")
    p.add_argument("--modes", default="ideal,teraio-host,ckpt,save_on_cpu,fsdp2-offload",
                   help="comma-separated modes (see --list-modes); default %(default)s")
    p.add_argument("--out", default="out/train_llm", help="directory for the table, JSON and timelines")
    p.add_argument("--steps", type=int, default=3, help="measured steps per mode (default 3)")
    p.add_argument("--warmup", type=int, default=2,
                   help="warm-up steps of the non-TeraIO modes (default 2); TeraIO modes warm up for "
                        "1 + --profile-steps steps, so that their first measured step is a planned one")
    p.add_argument("--layers", type=int, help="override the workload's number of decoder layers")
    p.add_argument("--attn", choices=("sdpa", "eager", repeated_kv.CHOICE), default="sdpa",
                   help="attention implementation (transformers); sdpa-repeat-kv: SDPA with the key/value heads "
                        "repeated first, so that a fused kernel can take fp32 grouped heads (bench/repeated_kv.py)")
    p.add_argument("--host-syncs", choices=("model", "off"), default="model",
                   help="off: take the host syncs out of each micro-batch's forward without changing what is "
                        "computed: the inputs are copied from pinned memory without waiting, and transformers' "
                        "check for packed sequences (a .all() in a Python if) is skipped, since the inputs are "
                        "one sequence a row. The result's host_syncs field says what was done")
    p.add_argument("--gc-freeze", choices=("on", "off"), default="off",
                   help="on: after setup and again before the first measured step, collect and then move "
                        "every object Python's collector tracks into its permanent generation (gc.freeze), "
                        "so that full collections during the steps no longer scan the model's objects; the "
                        "same computation. Every mode alike; the result's gc_freeze field says what was done")
    p.add_argument("--cublas-config", choices=("settle", "keep"), default="settle",
                   help="settle: drop CUBLAS_WORKSPACE_CONFIG after the deterministic check where its size is the "
                        "default (sm_90), since PyTorch parses it on every cuBLAS call; keep: leave it set")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                   help="torch.use_deterministic_algorithms(True) and a fixed cuBLAS workspace (default on)")
    p.add_argument("--extrapolate", metavar="L1,L2,L3",
                   help="measure ideal at L1 and L2 layers, fit time = a + b x layers, predict the workload's "
                        "layer count, and check the line at L3 (for a model whose ideal does not fit)")
    p.add_argument("--reserve", default="2GiB",
                   help="cap minus TeraIO's gpu_budget: untracked memory such as the cuBLAS workspace and "
                        "allocator slack (default %(default)s)")
    p.add_argument("--teraio-budget",
                   help="TeraIO's gpu_budget, set directly instead of budget - reserve (on a CPU, where there is "
                        "no cap, this is what makes TeraIO move tensors)")
    p.add_argument("--host-budget", default="48GiB", help="pinned host tier of teraio-host (default %(default)s)")
    p.add_argument("--mixed-host-budget", help="host tier of teraio-mixed (default: half of --host-budget)")
    p.add_argument("--ssd-dir", help="swap directory of teraio-ssd and teraio-mixed (default "
                                     "/var/tmp/teraio/bench-swap/WORKLOAD); swap files are kept and reused: "
                                     "deleting large files on that disk takes minutes")
    p.add_argument("--ssd-capacity", default="48GiB", help="swap file size (default %(default)s)")
    p.add_argument("--profile-steps", type=int, default=1, help="TeraIO profile steps (default 1)")
    p.add_argument("--recompute-counts", metavar="N,N,...",
                   help="teraio-recompute: the counts of recomputed layers to try (default: tune's search)")
    p.add_argument("--release-tracking", choices=("on", "off"), default="on",
                   help="TeraIO modes: Session(record_releases=...): whether the profile records when each storage "
                        "is freed (default on; off: planned as freed at its last use)")
    p.add_argument("--copy-order", choices=("deadline", "deadline-alone", "deadline-chunked", "deadline-host-waits",
                                             "deadline-host-waits-in", "deadline-device-waits-in", "issue"),
                   default="deadline",
                   help="TeraIO modes: Session(copy_order=...): the CUDA copier runs each direction's copies by the "
                        "plan's deadlines (default), by deadline with a copy the GPU waits for alone on the link "
                        "(deadline-alone), by deadline with the rest of a copy waited for queued in chunks too "
                        "(deadline-chunked), by deadline with the host waiting for a copy's marker instead of "
                        "gating it (deadline-host-waits), so for copies into the device only "
                        "(deadline-host-waits-in), by deadline with the GPU waiting for such copies into the device "
                        "on a flag the copier sets behind them, the host going on (deadline-device-waits-in), "
                        "or as issued")
    p.add_argument("--copy-chunk", default=None,
                   help="TeraIO modes: Session(copy_chunk=...): the piece the deadline orders queue at a time "
                        "(1MiB to 256MiB, a multiple of 4 KiB; default TeraIO's, 8MiB)")
    p.add_argument("--recast-weights", choices=("on", "off"), default="on",
                   help="TeraIO and recast modes: Session(recast_weights=...): make autocast's bf16 copies of the "
                        "weights again in the backward pass instead of keeping them from the forward (teraio.recast; "
                        "default on)")
    p.add_argument("--recast-activations", choices=("on", "off"), default="on",
                   help="TeraIO and recast modes: Session(recast_activations=...): keep cheap activations (silu, "
                        "products of two activations) as recipes made again in backward, and one of equal dtype "
                        "copies (teraio.remake; default on)")
    p.add_argument("--reuse-blocks", choices=("on", "off"), default="off",
                   help="TeraIO modes: Session(reuse_blocks=...): the device block of a tensor moved out is kept, inside "
                        "the budget, for a later fetch of its size (default off: on W3 it more than doubled the allocator's "
                        "flushes and made the step 9%% slower, bench/RESULTS.md session 24)")
    p.add_argument("--pcie-duplex", metavar="RATE",
                   help="TeraIO modes: Session(bandwidths={'duplex': RATE}): both PCIe directions together while "
                        "both are busy, e.g. 94GB/s (the H100 machines, bench/RESULTS.md session 19), for the planner's "
                        "booking, its search for planned waits and the prediction (default: each direction at its "
                        "own probed rate)")
    p.add_argument("--plan-pcie", metavar="RATE",
                   help="TeraIO modes: Session(bandwidths={'d2h': RATE, 'h2d': RATE}): plan for this PCIe rate each "
                        "way instead of the start-up probe's, e.g. 46GB/s, what W3's copier lanes reach with both "
                        "directions busy (bench/RESULTS.md session 33; default: the probe's)")
    p.add_argument("--plan-latency", metavar="TIME",
                   help="TeraIO modes: Session(request_latency=TIME), e.g. 200us: the fixed cost per copy the "
                        "planner plans with (default: the planner's 20us). The plans are just in time, so a runtime "
                        "that adds more per copy falls behind; a plan for more latency issues copies earlier "
                        "(bench/RESULTS.md, session 30)")
    p.add_argument("--plan-margin", metavar="SIZE",
                   help="TeraIO modes: Session(plan_margin=SIZE): the plan keeps SIZE free below the budget the "
                        "runtime enforces, so that the runtime's count running a few MiB above the simulator's does "
                        "not evict a tensor the plan keeps (default: 64MiB, or a 256th of the budget where less; 0: "
                        "plan for the whole budget, as before session 32)")
    p.add_argument("--hole", default="0", metavar="SIZE",
                   help="TeraIO modes: Session(hole_bytes=SIZE): planned steps hold a device block of SIZE, inside "
                        "the budget, and hand it to the allocator just before an operator whose largest output "
                        "was over half that size last step (default 0, none: with 2004MiB, a vocabulary-sized fp32 "
                        "weight, W3 ran 3%% slower than with the same budget as reserve, bench/RESULTS.md session 24)")
    p.add_argument("--keep-copies", choices=("on", "off"), default="off",
                   help="TeraIO modes: Session(keep_copies=...): a tensor only read since it came back (a weight "
                        "between micro-batches) keeps its tier copy, and moving it out again drops its device memory "
                        "instead of copying it (default off)")
    p.add_argument("--retime", type=int, default=0, metavar="N",
                   help="TeraIO modes: Session(retime_steps=N): the first N planned steps after each profile time "
                        "their operators again and the session plans anew on those times (default %(default)s); "
                        "these steps count as warm-up")
    p.add_argument("--stall-rounds", type=int, default=None, metavar="N",
                   help="TeraIO modes: Session(stall_rounds=N): rounds of the planner's stall search (default: the "
                        "planner's, 64; 24 before session 27)")
    p.add_argument("--early-prefetch-lead", type=float, default=None, metavar="X",
                   help="TeraIO modes: Session(early_prefetch_lead=X): how far earlier the planner may move a "
                        "prefetch while memory allows, in its own transfer times (default: the planner's, 100)")
    p.add_argument("--min-migration-share", type=float, default=None, metavar="X",
                   help="TeraIO modes: Session(min_migration_share=X): never plan to move a storage smaller than this "
                        "share of the budget (default: the planner's, 1/65536; 0 moves any size, as before session 37)")
    p.add_argument("--gpu-profile", action="store_true",
                   help="after the measured steps, run one more step under torch.profiler (CUDA) and report "
                        "where its GPU time went (bench/gpu_profile.py): kernels, idle time with and without "
                        "copies running, the copies' bandwidth one way and both ways at once")
    p.add_argument("--flush-sizes", action="store_true",
                   help="after the measured steps, run one more step with the CUDA allocator's history on and "
                        "report which requests made it flush its cache: their sizes and Python frames "
                        "(bench/flush_sizes.py; CUDA only)")
    p.add_argument("--save-trace", action="store_true",
                   help="TeraIO modes: save the profiled trace (binary), the plan, and each measured "
                        "step's device waits (bench/device_stalls.py) beside the timeline")
    p.add_argument("--recompute-tier", choices=("host", "ssd", "mixed"), default="host",
                   help="teraio-recompute: the tiers, as in teraio-host, teraio-ssd or teraio-mixed (default host)")
    p.add_argument("--recompute-trials", type=int, default=9,
                   help="teraio-recompute: most trials of tune's search (default %(default)s)")
    p.add_argument("--recompute-measure", type=int, default=2,
                   help="teraio-recompute: timed steps per trial, the fastest counts (default %(default)s); 0 times "
                        "none and compares the predicted steps (with --save-trace: each count's trace, cheaply)")
    p.add_argument("--child-timeout", type=float, default=900, help="seconds before a mode is killed (default 900)")
    p.add_argument("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF for every mode, e.g. expandable_segments:True")
    p.add_argument("--allocator", choices=("caching", "paged"), default="caching",
                   help="every mode's CUDA allocator: PyTorch's caching allocator (default; --alloc-conf tunes it) or "
                        "TeraIO's paged device memory (teraio.paged: blocks mapped from pages at their own addresses, "
                        "no flush of the cache at the cap)")
    p.add_argument("--paged-page", metavar="SIZE",
                   help="--allocator paged: its physical page (default 8MiB; a multiple of the device's granularity, "
                        "2 MiB on an H100; larger pages take fewer driver calls per block, bench/vmm_costs.py)")
    p.add_argument("--paged-record", choices=("on", "off"), default="off",
                   help="--allocator paged: keep every request the allocator serves in the measured steps (inside "
                        "the timed steps: a map lookup and a list append a request, under the allocator's lock) "
                        "and write them beside the results as STEM-MODE-paged-requests.txt, for `teraio "
                        "paged-replay` (default off)")
    p.add_argument("--hold-copies", choices=("on", "to-host", "off"), default="off",
                   help="--allocator paged, TeraIO modes: Session(hold_copies_to_map=...): the allocator holds the "
                        "session's copies back and waits for those on the link before it maps or unmaps (CUDA's "
                        "calls wait for the copy engines, page by page; bench/RESULTS.md session 43): on = both "
                        "directions, to-host = only the copies out of the device, which make the calls dear "
                        "(session 44), so that prefetches go on; needs a deadline --copy-order (default off)")
    p.add_argument("--plot", action="store_true", help="after the run, plot every table in --out (matplotlib)")
    p.add_argument("--plot-from", metavar="DIR", help="only plot the tables already in DIR")
    p.add_argument("--list-modes", action="store_true", help="list the modes and exit")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.list_modes or args.plot_from or args.child:
        return args
    if args.workload is None:
        p.error("--workload is required (W1, W2, W3 or tiny)")
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.mode_list if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    if args.steps < 1 or args.warmup < 0 or args.profile_steps < 1 or args.recompute_trials < 1 \
            or args.recompute_measure < 0 or args.retime < 0 or (args.stall_rounds or 0) < 0 \
            or not math.isfinite(args.early_prefetch_lead or 0) or (args.early_prefetch_lead or 0) < 0:
        p.error("--steps, --profile-steps and --recompute-trials must be at least 1, "
                "--warmup, --recompute-measure, --retime, --stall-rounds and --early-prefetch-lead at least 0")
    if args.min_migration_share is not None and not 0 <= args.min_migration_share < 1:
        p.error("--min-migration-share must be in [0, 1)")
    try:
        for name in ("budget", "reserve", "teraio_budget", "host_budget", "mixed_host_budget", "ssd_capacity",
                     "plan_margin"):
            if getattr(args, name) is not None:
                parse_size(getattr(args, name))
        args.extrapolation = parse_layer_counts(args.extrapolate) if args.extrapolate else None
        if args.recompute_counts:
            parse_counts(args.recompute_counts)
        for flag, rate in (("--pcie-duplex", args.pcie_duplex), ("--plan-pcie", args.plan_pcie)):
            if rate is not None and parse_rate(rate) <= 0:
                raise ValueError(f"{flag} {rate!r}: want a rate above 0, such as 94GB/s")
        if args.plan_latency is not None:
            parse_duration(args.plan_latency)
    except ValueError as error:
        p.error(str(error))
    if args.copy_chunk is not None:
        try:
            parse_size(args.copy_chunk)
        except ValueError as error:
            p.error(str(error))
    if args.paged_record == "on" and args.allocator != "paged":
        p.error("--paged-record is for --allocator paged")
    if args.hold_copies != "off" and args.allocator != "paged":
        p.error("--hold-copies is for --allocator paged")
    if args.hold_copies != "off" and args.copy_order == "issue":
        p.error("--hold-copies needs a deadline --copy-order: issue order puts each copy straight onto a stream")
    if any(m.startswith("teraio") for m in args.mode_list) and args.budget is None and args.teraio_budget is None:
        p.error("TeraIO modes need --budget (gpu_budget = budget - reserve) or --teraio-budget")
    if args.allocator == "paged" and (args.flush_sizes or args.alloc_conf):
        p.error("--flush-sizes and --alloc-conf are about PyTorch's caching allocator; --allocator paged replaces it")
    if args.paged_page is not None:
        if args.allocator != "paged":
            p.error("--paged-page is for --allocator paged")
        try:
            parse_size(args.paged_page)
        except ValueError as error:
            p.error(str(error))
    return args


def parse_size(text):
    """Bytes in a size such as 24GiB, parsed by TeraIO; plain byte counts without its native module."""
    try:
        from teraio import _native
    except ImportError:
        if str(text).isdigit():
            return int(text)
        raise ValueError(f"size {text!r}: without TeraIO's native module only plain byte counts are accepted")
    try:
        return _native.parse_bytes(text)
    except _native.Error as error:
        raise ValueError(f"size {text!r}: {error}") from None


def parse_with_teraio(what, parser, text):
    """`text` read by TeraIO's native parser `parser` (a ValueError naming `what` if it cannot)."""
    try:
        from teraio import _native
    except ImportError:
        raise ValueError(f"{what} {text!r}: parsing a {what} needs TeraIO's native module") from None
    try:
        return getattr(_native, parser)(text)
    except _native.Error as error:
        raise ValueError(f"{what} {text!r}: {error}") from None


def parse_rate(text):
    """Bytes per second in a rate such as 94GB/s."""
    return parse_with_teraio("rate", "parse_bandwidth", text)


def parse_duration(text):
    """Seconds in a time such as 200us, 0 to 1 s."""
    seconds = parse_with_teraio("time", "parse_duration", text)
    if not 0 <= seconds <= 1:
        raise ValueError(f"time {text!r}: want 0 to 1 s, such as 200us")
    return seconds


def parse_counts(text):
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--recompute-counts: expected numbers of layers like 16,12,8, got {text!r}") from None
    if not counts or any(c < 0 for c in counts):
        raise ValueError(f"--recompute-counts: expected numbers of layers >= 0, got {text!r}")
    return counts


def parse_layer_counts(text):
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if len(counts) != 3 or counts[0] == counts[1] or min(counts) < 1:
        raise ValueError(f"--extrapolate {text!r}: want three layer counts L1,L2,L3 with L1 != L2")
    return counts


def workload_of(args):
    workload = WORKLOADS[args.workload]
    return dataclasses.replace(workload, layers=args.layers or workload.layers)


# ---------------------------------------------------------------------------------------------
# Child: one mode's training and what it measured (its model and peers: bench/llm_models.py)


def teraio_tiers(args, mode):
    """(host_budget, ssd paths) of a TeraIO mode."""
    ssd = [args.ssd_dir or f"/var/tmp/teraio/bench-swap/{args.workload}"]
    if mode == "teraio-recompute":
        return teraio_tiers(args, f"teraio-{args.recompute_tier}")
    if mode == "teraio-host":
        return args.host_budget, []
    if mode == "teraio-ssd":
        return 0, ssd
    return (args.mixed_host_budget or parse_size(args.host_budget) // 2), ssd


def teraio_gpu_budget(args):
    if args.teraio_budget is not None:
        return parse_size(args.teraio_budget)
    return parse_size(args.budget) - parse_size(args.reserve)


def open_session(args, mode, device):
    import teraio

    host, ssd = teraio_tiers(args, mode)
    for path in ssd:
        os.makedirs(path, exist_ok=True)
    return teraio.Session(gpu_budget=teraio_gpu_budget(args), host_budget=host, ssd=ssd,
                          ssd_capacity=args.ssd_capacity, warmup_steps=1, profile_steps=args.profile_steps,
                          device=device, record_releases=args.release_tracking == "on",
                          copy_order=args.copy_order, copy_chunk=args.copy_chunk, hold_copies_to_map=HELD_COPIES[args.hold_copies],
                          recast_weights=args.recast_weights == "on",
                          recast_activations=args.recast_activations == "on", keep_copies=args.keep_copies == "on",
                          retime_steps=args.retime, stall_rounds=args.stall_rounds,
                          early_prefetch_lead=args.early_prefetch_lead,
                          min_migration_share=args.min_migration_share,
                          reuse_blocks=args.reuse_blocks == "on",
                          hole_bytes=args.hole, plan_margin=args.plan_margin,
                          request_latency=parse_duration(args.plan_latency) if args.plan_latency else None,
                          bandwidths=planned_bandwidths(args))


def planned_bandwidths(args):
    """Session(bandwidths=...) from --pcie-duplex and --plan-pcie; None: every rate probed."""
    rates = {"duplex": parse_rate(args.pcie_duplex)} if args.pcie_duplex else {}
    if args.plan_pcie:
        rates.update(d2h=parse_rate(args.plan_pcie), h2d=parse_rate(args.plan_pcie))
    return rates or None


def configure_numerics(args, workload):
    tf32 = workload.precision == "fp32-tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if args.deterministic:
        torch.use_deterministic_algorithms(True)


def settle_cublas_workspace(device, result, keep=False):
    """Drops CUBLAS_WORKSPACE_CONFIG once PyTorch has checked it, where its size is the default.

    PyTorch 2.11 parses the variable with a std::regex on every cuBLAS call (at::cuda::
    parseChosenWorkspaceSize, not cached): 4.6% of the training threads' host time on W3, the
    same in every mode. Deterministic mode reads it only once, at the first cuBLAS call, and on
    Hopper (sm_90) ":4096:8" is the default size anyway (32 MiB), so after one call it is dropped
    there; elsewhere it stays. `result["cublas_workspace"]` says which happened."""
    value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if device.type != "cuda":
        result["cublas_workspace"] = "none (CPU)"
        return
    if value is None:
        result["cublas_workspace"] = "default (CUBLAS_WORKSPACE_CONFIG unset)"
        return
    if keep or torch.cuda.get_device_capability(device) != (9, 0) or value != ":4096:8":
        result["cublas_workspace"] = f"CUBLAS_WORKSPACE_CONFIG={value}, parsed on every cuBLAS call"
        return
    one = torch.ones(8, 8, device=device)
    torch.mm(one, one)  # the deterministic check reads the variable here, once per process
    torch.cuda.synchronize(device)
    del os.environ["CUBLAS_WORKSPACE_CONFIG"]
    result["cublas_workspace"] = ("CUBLAS_WORKSPACE_CONFIG=:4096:8 for the deterministic check, then unset "
                                  "(the sm_90 default, 32 MiB)")


def apply_cap(args, device, result):
    if args.budget is None:
        result["cap"] = "none"
        return
    if device.type != "cuda":
        result["cap"] = "not enforced on CPU"
        return
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, parse_size(args.budget) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    result["cap"] = f"{fmt_size(parse_size(args.budget))} ({fraction:.4f} of {fmt_size(total)})"


def train_step(lm, optimizer, micro_batches, workload, device, mode, recasting=None):
    """Forward and backward of every micro-batch (gradients accumulated), then the optimizer step.
    `recasting()`, when given, is the recast mode's context around each micro-batch."""
    losses = []
    for batch in micro_batches:
        if mode == "save_on_cpu":
            saving = torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
        elif recasting is not None:
            saving = recasting()
        else:
            saving = contextlib.nullcontext()
        with saving:
            with _autocast(workload, device):
                loss = lm.loss(batch, device)
            (loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    optimizer.step()
    lm.module.zero_grad(set_to_none=True)
    return torch.stack(losses).mean()


def _autocast(workload, device):
    if workload.precision != "bf16-autocast":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(args, workload, mode, device, result, stem):
    configure_numerics(args, workload)
    settle_cublas_workspace(device, result, keep=args.cublas_config == "keep")
    if mode == "ideal":
        result["cap"] = "none (ideal)"
    else:
        apply_cap(args, device, result)
    lm = build_model(workload, args.attn, device)
    result["model"] = lm.description
    result["host_syncs"] = (without_host_syncs(lm, device) if args.host_syncs == "off"
                            else "as the model makes them (inputs copied from pageable memory)")
    if mode == "ckpt":
        enable_checkpointing(lm)
    elif mode == "sac":
        enable_selective_checkpointing(lm)
    teraio_mode = mode.startswith("teraio")
    warmup = 1 + args.profile_steps + args.retime if teraio_mode else args.warmup
    batches = batch_stream(lm, workload)
    with contextlib.ExitStack() as stack:
        if mode == "fsdp2-offload":
            stack.enter_context(single_process_group(device))
            shard_with_cpu_offload(lm)
        optimizer = make_optimizer(lm.module)
        session = open_session(args, mode, device) if teraio_mode else None
        recasts, recasting = None, None
        if mode == "recast":
            from teraio import recast

            recasts = recast.Recasts()
            recasting = functools.partial(recast.saved_tensors, recasts, weights=args.recast_weights == "on",
                                          activations=args.recast_activations == "on")
        watch = host_watch.HostWatch(device)
        stack.callback(watch.close)
        if args.gc_freeze == "on":
            stack.callback(gc.unfreeze)
            frozen_at_setup = host_watch.freeze_collector()
            # Said now, so that a mode that fails before its measured steps records it too.
            result["gc_freeze"] = f"gc.freeze(): {frozen_at_setup} objects frozen after setup"

        def one_step(measured):
            loss = train_step(lm, optimizer, next(batches), workload, device, mode, recasting)
            record = {"step": len(result["steps"]), "measured": measured, "time_s": None}
            result["steps"].append(record)
            return record, loss

        def note_loss(record, loss):
            record["loss"] = loss.item()
            record["loss_hex"] = float(record["loss"]).hex()

        if mode == "teraio-recompute":
            result["recompute"] = tune_recomputation(args, lm, session, lambda: note_loss(*one_step(False)),
                                                     f"{stem}-{mode}")
            # The session's record of the tuning steps: their times and what moved.
            natives = {native["step"]: native for native in session.report()["steps"]}
            for record in result["steps"]:
                native = natives.get(record["step"], {})
                record["time_s"] = native.get("time_s")
                record.update(session_fields(native))
            # A count profiled again at the end of the search still has its plan to time.
            warmup = session.retime_steps_left
        tuned = len(result["steps"])
        saved = False
        recording = args.paged_record == "on" and device.type == "cuda"
        if recording:
            from teraio import paged as paged_allocator
        device_waits = []  # --save-trace: each measured step's Session.device_waits()
        for i in range(warmup + args.steps):
            if args.gc_freeze == "on" and i == warmup:  # outside the timed part, as the setup's
                result["gc_freeze"] = (f"gc.freeze(): {frozen_at_setup} objects frozen after setup, "
                                       f"{host_watch.freeze_collector()} in all before the first measured step")
            if recording and i == warmup:
                paged_allocator.start_recording()
            # The allocator's counters are read outside the timed part.
            with watch.step() as held_up:
                _sync(device)
                started = time.perf_counter()
                with session.step() if session is not None else contextlib.nullcontext():
                    record, loss = one_step(i >= warmup)
                _sync(device)
                record["time_s"] = time.perf_counter() - started
            record.update(held_up)
            if recording and record["measured"]:
                paged_allocator.mark_step()
            note_loss(record, loss)
            if session is not None:
                record.update(session_fields(session.last_step))
            print_step(args, mode, record, tuned + warmup + args.steps)
            if args.save_trace and session is not None and record["measured"]:
                device_waits.append({"step": record["step"], "time_s": record["time_s"],
                                     "device_stall_s": session.last_step["device_stall_s"],
                                     "waits": session.device_waits()})
            if args.save_trace and session is not None and session.last_step.get("planned_now"):
                # Saved whenever a plan is made, so that a failing planned step still leaves them.
                save_trace_and_plan(session, f"{stem}-{mode}")
                saved = True
        def extra_step(phase):
            """One more, unmeasured step for a profiler or recorder around it; returns what notes
            its record (as `phase`), to be called once the recording is over."""
            with session.step() if session is not None else contextlib.nullcontext():
                record, loss = one_step(False)
            _sync(device)

            def finish():
                note_loss(record, loss)
                if session is not None:
                    record.update(session_fields(session.last_step))
                record["phase"] = phase
            return finish

        if recording:
            path = f"{stem}-{mode}-paged-requests.txt"
            result["paged_recording"] = {"file": path, "requests": paged_allocator.save_recording(path)}
            print(f"[{mode}] paged allocator: {result['paged_recording']['requests']} requests of "
                  f"{args.steps} measured steps in {path} (teraio paged-replay)", flush=True)
        if args.gpu_profile and device.type == "cuda":
            result["gpu_profile"] = profile_one_step(lambda: extra_step("gpu-profile"), f"{stem}-{mode}")
            print(f"[{mode}] gpu profile: {gpu_profile.describe(result['gpu_profile'])}", flush=True)
            if line := gpu_profile.awaited(result["gpu_profile"]):
                print(f"[{mode}] {line}", flush=True)
            for line in gpu_profile.late_scopes(result["gpu_profile"]):
                print(f"[{mode}] {line}", flush=True)
        if args.flush_sizes:
            if device.type == "cuda":
                result["flush_sizes"] = flush_sizes.record_one_step(lambda: extra_step("flush-sizes"), device)
                for line in flush_sizes.describe(result["flush_sizes"]):
                    print(f"[{mode}] flush sizes: {line}", flush=True)
            else:
                print(f"[{mode}] --flush-sizes: skipped, the allocator's history is CUDA's only", flush=True)
        if recasts is not None:
            result["recast"] = recasts.describe()
            print(f"[{mode}] teraio.recast: {result['recast']}", flush=True)
        if session is not None:
            if args.save_trace and not saved:  # planned before this loop (the tuner's session)
                save_trace_and_plan(session, f"{stem}-{mode}")
            if args.save_trace:
                # Beside the trace and plan: bench/device_stalls.py lines them up with the simulation.
                pathlib.Path(f"{stem}-{mode}-device-waits.json").write_text(
                    json.dumps({"mode": mode, "steps": device_waits}))
            result["teraio"] = teraio_summary(session, f"{stem}-{mode}", args.save_trace)
            if session.recasts is not None:
                result["recast"] = session.recasts.describe()
                print(f"[{mode}] teraio.recast: {result['recast']}", flush=True)
            # Closing brings every offloaded tensor back to the device, which a budget far below the
            # model states cannot hold: the measurements stand, the failure to close is reported.
            try:
                session.close()
            except Exception as error:  # noqa: BLE001 - recorded beside the measurements
                result["close_error"] = f"{type(error).__name__}: {str(error)[:300]}"
                print(f"[{mode}] session.close() failed after the measured steps: {result['close_error']}",
                      flush=True)


def profile_one_step(run_step, prefix):
    """One more (unmeasured) step under torch.profiler; the summary of its GPU timeline. run_step()
    runs the step and returns what notes its record."""
    from torch.profiler import ProfilerActivity, profile
    trace = f"{prefix}-gpu-trace.json"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        finish = run_step()
    finish()
    prof.export_chrome_trace(trace)
    try:
        return gpu_profile.summarize_trace(trace)
    finally:
        os.remove(trace)  # hundreds of MB for a W2 step: only the summary is kept


def session_fields(native):
    """What a bench step record keeps of the session's own record of that step."""
    return {k: native[k] for k in STEP_FIELDS + OPTIONAL_STEP_FIELDS if k in native}


def tune_recomputation(args, lm, session, step, prefix):
    """teraio-recompute: tune() picks how many of the last decoder layers to recompute; what it
    tried goes to the result. With --save-trace, every trial's profile (and plan) is saved as
    PREFIX-cCOUNT-trace.tiotrace, so that each count's bound can be taken (bench/bounds.py); a
    count tried again (`--recompute-counts 0,1,0`) as PREFIX-cCOUNT-N, N its trial of that count,
    so that two profiles of one step can be compared."""
    from teraio import recompute

    saved = collections.Counter()

    def save_trial(trial):
        saved[trial.count] += 1
        again = f"-{saved[trial.count]}" if saved[trial.count] > 1 else ""
        if trial.failed:  # a failed trial has a profile but no plan
            session.save_trace(f"{prefix}-c{trial.count}{again}-trace.tiotrace")
        else:
            save_trace_and_plan(session, f"{prefix}-c{trial.count}{again}")

    counts = parse_counts(args.recompute_counts) if args.recompute_counts else None
    choice = recompute.tune(session, lm.blocks, step, counts=counts,
                            measure_steps=args.recompute_measure, max_trials=args.recompute_trials,
                            progress=lambda line: print(f"  [{args.workload} teraio-recompute] {line}", flush=True),
                            on_trial=save_trial if args.save_trace else None)
    return {"count": choice.count, "layers": choice.layers, "tuning_steps": choice.steps,
            "returned_by": choice.returned_by, "trials": [dataclasses.asdict(t) for t in choice.trials],
            "summary": choice.describe()}


def print_step(args, mode, record, total):
    line = (f"  [{args.workload} {mode}] step {record['step'] + 1}/{total} "
            f"{'measured' if record['measured'] else 'warm-up '} {record['time_s']:.3f} s loss {record['loss']:.5f}")
    if "phase" in record:
        moved = record["bytes_to_host"] + record["bytes_to_ssd"]
        line += f"  {record['phase']}/{record['mode']} stall {record['stall_s']:.3f} s out {fmt_size(moved)}"
        if record.get("bytes_dropped"):
            line += f" dropped {fmt_size(record['bytes_dropped'])}"
        if record.get("copies_given_up"):
            line += f" (kept copies given up {record['copies_given_up']})"
        if record.get("positioned") or record.get("positioned_back"):
            line += f" positioned {record.get('positioned', 0)} out {record.get('positioned_back', 0)} back"
        if record["demand_fetches"]:
            line += f" demand {record['demand_fetches']}"
        if record.get("evictions"):
            line += f" evictions {record['evictions']}"
            if record.get("late_free_evictions"):
                line += f" ({record['late_free_evictions']} for late frees)"
        if record.get("host_syncs"):
            line += f" host syncs {record['host_syncs']}"
        if record.get("cancelled_offloads"):
            line += (f" taken back {record['cancelled_offloads']}"
                     f" ({fmt_size(record.get('bytes_abandoned', 0))} not copied)")
        if record.get("callback_s") is not None:
            line += f" callbacks {record['callback_s']:.3f} s"
            if parts := record.get("callback_parts_s"):
                line += " (" + ", ".join(f"{name} {s:.3f}" for name, s in parts.items()) + ")"
            if parts := record.get("before_op_parts_s"):
                line += " before_op: " + ", ".join(f"{name} {s:.3f}" for name, s in parts.items())
            if record.get("freed_scans") is not None:
                line += f" freed scans {record['freed_scans']} ({record['freed_scan_s']:.3f} s)"
            if record.get("blocks_reused"):
                line += f" blocks reused {record['blocks_reused']}"
            if record.get("hole_opened") or record.get("hole_taken"):
                line += (f" hole handed over {record['hole_opened']} taken {record['hole_taken']}"
                         f" ({record['hole_take_flushes']} flushes taking it)")
    if record.get("gc_collections"):
        line += f" gc {record['gc_s']:.3f} s ({record['gc_collections']})"
    if record.get("alloc_retries") or record.get("device_allocs") or record.get("device_frees"):
        line += f" allocator retries {record['alloc_retries']}"
        if record.get("fetch_flushes") is not None:
            line += f" ({record['fetch_flushes']} in TeraIO's fetches, {record['fetch_flush_s']:.3f} s)"
        line += f" allocs {record['device_allocs']} frees {record['device_frees']}"
    if record.get("paged_allocations"):
        line += " " + host_watch.describe_paged(record)
    if record.get("link"):
        line += " link: " + link_activity.describe(record["link"])
    print(line, flush=True)


def save_trace_and_plan(session, prefix):
    """The trace and plan the measured steps run: `teraio plan` and `teraio simulate` replay them
    off the GPU machine, so that the planner can be studied on the real workload."""
    session.save_trace(f"{prefix}-trace.tiotrace")
    session.save_plan(f"{prefix}-plan.json")


def teraio_summary(session, prefix, save_trace):
    report = session.report()
    timeline = f"{prefix}-timeline.json"
    session.export_timeline(timeline)
    saved = {"trace": f"{prefix}-trace.tiotrace", "plan_file": f"{prefix}-plan.json"} if save_trace else {}
    plan = dict(report["plan"])
    return {"phase": session.phase, "plan": plan, "predictions": {k: plan.get(k) for k in PLAN_PREDICTIONS},
            "backends": report["backends"], "gpu_budget": report["gpu_budget"], "host_budget": report["host_budget"],
            "footprint_bytes": report["footprint_bytes"], "planned_peak_bytes": report["planned_peak_bytes"],
            "timeline": timeline, **saved}


def memory_peaks(device, result):
    """Peak GPU memory over the whole child and peak pinned host memory where it can be seen."""
    peaks = {"peak_allocated": None, "peak_reserved": None, "host_memory_stats": None, "pinned_host_peak": None,
             "pinned_host_source": None}
    if device.type != "cuda":
        return peaks
    pinned_budget = (result.get("teraio") or {}).get("host_budget")
    if pinned_budget:
        peaks.update(pinned_host_peak=pinned_budget, pinned_host_source="TeraIO host tier (host_budget)")
    import teraio.paged
    if (paged := teraio.paged.stats()) is not None:
        # PyTorch keeps no statistics under a pluggable allocator: the paged allocator's own.
        peaks.update(peak_allocated=paged["peak_in_use_bytes"], peak_reserved=paged["peak_held_bytes"],
                     paged_allocator=paged)
    else:
        peaks["peak_allocated"] = torch.cuda.max_memory_allocated(device)
        peaks["peak_reserved"] = torch.cuda.max_memory_reserved(device)
    stats_of = getattr(torch.cuda, "host_memory_stats", None)
    if stats_of is None:
        return peaks
    stats = dict(stats_of())
    peaks["host_memory_stats"] = stats
    key = next((k for k in ("allocated_bytes.peak", "allocated_bytes.all.peak") if k in stats),
               next((k for k in stats if k.endswith(".peak") and "bytes" in k and "alloc" in k), None))
    if key is not None and stats[key]:
        # TeraIO's host tier is pinned outside torch's host allocator: both count.
        peaks["pinned_host_peak"] = (pinned_budget or 0) + stats[key]
        peaks["pinned_host_source"] = " + ".join(filter(None, [peaks["pinned_host_source"], f"torch {key}"]))
    return peaks


def failure_status(error):
    message = str(error).strip()
    if "out of memory" in message.lower():
        return "oom"
    kind = getattr(error, "kind", None)
    first = message.splitlines()[0] if message else ""
    return f"error: {type(error).__name__}{f' ({kind})' if kind else ''}: {first[:300]}"


def run_mode(args, mode):
    workload = workload_of(args)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    result = {"mode": mode, "layers": workload.layers, "status": "ok", "steps": [], "allocator": "none (CPU)"}
    if device.type == "cuda":
        if args.allocator == "paged":
            import teraio.paged
            teraio.paged.install(device.index, args.paged_page)  # before CUDA starts: swapped only then
        result["allocator"] = (f"teraio.paged (pages of {fmt_size(teraio.paged.stats()['page_bytes'])})"
                               if args.allocator == "paged" else
                               f"caching ({os.environ.get('PYTORCH_CUDA_ALLOC_CONF') or 'default settings'})")
        torch.cuda.set_device(device)
    started = time.perf_counter()
    try:
        train(args, workload, mode, device, result, out_stem(args))
    except Exception as error:  # noqa: BLE001 - reported in the table; the other modes still run
        traceback.print_exc()
        result["status"] = failure_status(error)
        result["error_detail"] = str(error)[:4000]
    result["wall_s"] = time.perf_counter() - started
    result.update(memory_peaks(device, result))
    return result


def probe(args):
    """What the parent needs before it starts: device, versions, and the model's size."""
    workload = workload_of(args)
    info = {"status": "ok", "torch": torch.__version__, "cuda": torch.cuda.is_available(),
            "host_available_bytes": host_available_bytes()}
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, gpu_total_bytes=props.total_memory)
    else:
        info.update(device=f"cpu ({platform.machine()}, {os.cpu_count()} cores)", gpu_total_bytes=None)
    info.update(transformers=None, model=describe_model(args.attn))
    if transformers_available():
        import transformers

        info["transformers"] = transformers.__version__
    one = count_parameters(dataclasses.replace(workload, layers=1), args.attn)
    two = count_parameters(dataclasses.replace(workload, layers=2), args.attn)
    info.update(params_per_layer=two - one, params_fixed=one - (two - one))
    return info


def host_available_bytes():
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def child_main(args):
    if args.child == "probe":
        try:
            result = probe(args)
        except Exception as error:  # noqa: BLE001 - the parent says why it cannot run
            result = {"status": failure_status(error)}
    else:
        result = run_mode(args, args.child)
    with open(args.result, "w") as f:
        json.dump(result, f, default=str)
    return 0


# ---------------------------------------------------------------------------------------------
# Parent: run the modes and write the table (summaries, markdown, plot: bench/llm_table.py)


def out_stem(args):
    budget = args.budget.replace(" ", "") if args.budget else "nocap"
    layers = f"-{args.layers}L" if args.layers else ""
    return str(pathlib.Path(args.out) / f"{args.workload}{layers}-{budget}")


def run_child(args, argv, mode, layers=None):
    result_path = f"{out_stem(args)}-{mode}{f'-{layers}L' if layers else ''}.result.json"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(result_path)
    command = [sys.executable, str(SCRIPT), *argv, "--child", mode, "--result", result_path]
    if layers:
        command += ["--layers", str(layers)]
    env = dict(os.environ)
    if args.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    try:
        done = subprocess.run(command, env=env, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "status": f"timeout after {args.child_timeout:g} s", "steps": []}
    try:
        with open(result_path) as f:
            result = json.load(f)
    except (OSError, ValueError):
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
        return {"mode": mode, "status": f"error: child {how}, no result", "steps": []}
    os.unlink(result_path)
    return result


def params_at(probe_info, layers):
    return probe_info["params_fixed"] + layers * probe_info["params_per_layer"]


def does_not_fit(args, mode, probe_info, layers):
    """Why a mode cannot fit, from arithmetic on the model states, or None."""
    states = STATE_BYTES_PER_PARAM * params_at(probe_info, layers)
    gpu = probe_info["gpu_total_bytes"]
    if mode in STATES_ON_GPU and gpu is not None:
        if states > gpu:
            return f"does not fit: model states {fmt_size(states)} > GPU {fmt_size(gpu)}"
        if mode != "ideal" and args.budget is not None and states > parse_size(args.budget):
            return f"does not fit: model states {fmt_size(states)} > cap {fmt_size(parse_size(args.budget))}"
    host = probe_info["host_available_bytes"]
    if mode == "fsdp2-offload" and host is not None and states > host:
        return f"does not fit: model states {fmt_size(states)} > host MemAvailable {fmt_size(host)}"
    return None


def run_or_skip(args, argv, mode, probe_info, layers=None):
    """One mode in a child process, unless arithmetic says it cannot fit. `layers` overrides the
    workload's layer count (ideal by extrapolation)."""
    label = f"{mode}@{layers}L" if layers else mode
    reason = does_not_fit(args, mode, probe_info, layers or workload_of(args).layers)
    if reason is not None:
        print(f"[{label}] {reason}", flush=True)
        return {"mode": mode, "status": reason, "steps": []}
    print(f"[{label}] {MODES[mode]}", flush=True)
    started = time.perf_counter()
    result = run_child(args, argv, mode, layers)
    print(f"[{label}] {result['status']} ({time.perf_counter() - started:.1f} s with start-up)", flush=True)
    return result


def run_table(args, argv, probe_info):
    layers = workload_of(args).layers
    entries = {}
    ideal_s, ideal_losses, extrapolation = None, None, None
    modes = list(args.mode_list)
    if "ideal" in modes and args.extrapolation:
        modes.remove("ideal")
        runs = {c: run_or_skip(args, argv, "ideal", probe_info, c) for c in args.extrapolation}
        for c, run in runs.items():
            entries[f"ideal@{c}L"] = run
        extrapolation = extrapolate_ideal(runs, args.extrapolation, layers)
        ideal_s = extrapolation["step_s"]
        entries["ideal"] = {"mode": "ideal", "layers": layers, "status": f"extrapolated ({extrapolation['status']})",
                            "steps": [], "extrapolation": extrapolation}
    for mode in modes:
        entries[mode] = run_or_skip(args, argv, mode, probe_info)
        if mode == "ideal" and entries[mode]["status"] == "ok":
            ideal_steps = entries[mode]["steps"]
            ideal_s = median_of([s for s in ideal_steps if s["measured"]], "time_s")
            ideal_losses = {s["step"]: s["loss_hex"] for s in ideal_steps}
    for name, entry in entries.items():
        # The extrapolation's own runs have fewer layers: no share of the full model's ideal.
        entry["summary"] = summarize(entry, None if name.startswith("ideal@") else ideal_s, ideal_losses)
        if name == "ideal" and extrapolation is not None:
            entry["summary"].update(median_step_s=ideal_s, share_of_ideal=1.0 if ideal_s else None)
    return entries, extrapolation


def describe_cap(args, probe_info):
    if args.budget is None:
        return "none"
    if not probe_info["cuda"]:
        return "not enforced on CPU"
    return f"{args.budget} (torch.cuda.set_per_process_memory_fraction), all modes but ideal"


def bench_main(args, argv):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"train_llm: workload {args.workload}, budget {args.budget or 'none'}, modes {', '.join(args.mode_list)}",
          flush=True)
    probe_info = run_child(args, argv, "probe")
    if probe_info["status"] != "ok":
        print(f"train_llm: cannot run: {probe_info['status']}", file=sys.stderr)
        return 2
    workload = workload_of(args)
    params = params_at(probe_info, workload.layers)
    teraio_budget = teraio_gpu_budget(args) if args.teraio_budget or args.budget else None
    cap = describe_cap(args, probe_info)
    print(f"device: {probe_info['device']}; model: {probe_info['model']}, {params / 1e6:,.1f} M parameters; "
          f"cap: {cap}", flush=True)
    entries, extrapolation = run_table(args, argv, probe_info)
    table = {
        "benchmark": "train_llm", "workload": args.workload, "workload_config": dataclasses.asdict(workload),
        "budget": args.budget, "cap": cap, "teraio_gpu_budget": teraio_budget, "device": probe_info["device"],
        "torch": probe_info["torch"], "transformers": probe_info["transformers"], "model": probe_info["model"],
        "params": params, "model_states_bytes": STATE_BYTES_PER_PARAM * params,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([pathlib.Path(sys.executable).name, os.path.relpath(SCRIPT), *argv]),
        "args": {k: v for k, v in vars(args).items() if k not in ("child", "result")},
        "extrapolation": extrapolation, "modes": entries,
    }
    stem = out_stem(args)
    with open(f"{stem}.json", "w") as f:
        json.dump(table, f, indent=1, default=str)
    markdown = table_heading(table) + "\n\n" + table_markdown(table) + "\n" + table_notes(table)
    pathlib.Path(f"{stem}.md").write_text(markdown)
    print("\n" + markdown, flush=True)
    print(f"written: {stem}.json, {stem}.md", flush=True)
    if args.plot:
        plot_dir(out, MODES)
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.list_modes:
        for mode, what in MODES.items():
            print(f"{mode:14} {what}")
        return 0
    if args.plot_from:
        return plot_dir(args.plot_from, MODES)
    return bench_main(args, argv)


if __name__ == "__main__":
    sys.exit(main())
