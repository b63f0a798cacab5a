#!/usr/bin/env python3
"""How close any plan could come to ideal: the simulator's bound on TeraIO's own traces,
with their operator times calibrated to measured compute.

A trace saved by `train_llm.py --save-trace` holds the operator times of TeraIO's profile
step. That step runs host-bound under the observer, which overstates compute (7-17% on the
H100 runs in RESULTS.md), and more compute hides more transfers: a bound taken on it as it is
would be too kind. For each trace, this script scales the operator times so that the step
takes the compute time measured for that configuration (`teraio simulate --time-scale`), and
asks the simulator for its plan's step and for the bound no plan can beat at the given link
bandwidth. Both are printed as shares of the measured ideal step.

  python3 bench/bounds.py --ideal 0.346 --budget 34GiB --host 40GiB --pcie 55GB/s \\
      "recompute 2=W1-36GiB-teraio-recompute-trace.tiotrace:0.361" ...

Each configuration is NAME=TRACE:COMPUTE_S (a TRACE ending in .xz is read decompressed: the
traces kept in bench/results are), COMPUTE_S being the measured step time of that
configuration without transfers (for recomputation: the ideal step plus the extra kernel time
the GPU profile measured).
"""
from __future__ import annotations

import argparse
import json
import lzma
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def parse_config(text):
    name, sep, rest = text.partition("=")
    trace, sep2, compute = rest.rpartition(":")
    if not sep or not sep2 or not name or not trace:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=TRACE:COMPUTE_S")
    try:
        seconds = float(compute)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: COMPUTE_S {compute!r} is not a number") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: COMPUTE_S must be positive")
    return name, pathlib.Path(trace), seconds


def find_cli(given):
    if given:
        return given
    # scripts/test.sh builds into build/release; a plain CMake build into build.
    for build in ("release", "."):
        built = ROOT / "build" / build / "tools" / "teraio" / "teraio"
        if built.is_file():
            return str(built)
    return shutil.which("teraio")


# A budget no trace reaches: the probe that reads the profiled step plans nothing.
UNBOUNDED = "1024TiB"


def simulate(cli, trace, args, scale, workdir, budget=None):
    summary = pathlib.Path(workdir) / "summary.json"
    summary.unlink(missing_ok=True)
    command = [cli, "simulate", str(trace), "--budget", budget or args.budget, "--host-capacity", args.host,
               "--pcie", args.pcie, "--time-scale", repr(scale), "--summary", str(summary)]
    if args.pcie_duplex:
        command += ["--pcie-duplex", args.pcie_duplex]
    done = subprocess.run(command, capture_output=True, text=True)
    # Exit status 3 with a summary: the simulated plan broke the budget somewhere (counted in
    # the summary's violations, shown in the table); anything else is a failure.
    if done.returncode not in (0, 3) or not summary.is_file():
        raise SystemExit(f"bounds.py: {' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    reason = next((line.split(": ", 1)[-1] for line in done.stdout.splitlines() if line.startswith("bound ")), "")
    return json.loads(summary.read_text()), reason


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="+", type=parse_config, metavar="NAME=TRACE:COMPUTE_S")
    p.add_argument("--ideal", type=float, required=True, help="measured ideal step (s): the shares' reference")
    p.add_argument("--budget", required=True, help="TeraIO's gpu_budget for the traces, e.g. 34GiB")
    p.add_argument("--host", default="40GiB", help="host tier capacity (default 40GiB)")
    p.add_argument("--pcie", default="55GB/s", help="link bandwidth each way (default 55GB/s, WORKLOADS.md)")
    p.add_argument("--pcie-duplex", help="both directions together while both are busy, e.g. 94GB/s (WORKLOADS.md); "
                                         "the simulated plan and the bound both take it (default: none)")
    p.add_argument("--teraio", help="the teraio CLI (default: build/tools/teraio/teraio, else PATH)")
    args = p.parse_args(argv)
    cli = find_cli(args.teraio)
    if not cli:
        p.error("no teraio CLI found: build it (bash scripts/test.sh) or give --teraio")
    for name, trace, _ in args.configs:
        if not trace.is_file():
            p.error(f"{name}: no trace at {trace}")
    both = f", {args.pcie_duplex} both ways at once" if args.pcie_duplex else ""
    print(f"budget {args.budget}, host tier {args.host}, {args.pcie} each way{both}, ideal {args.ideal:.3f} s\n")
    print("| configuration | profiled (s) | compute (s) | scale | planned, simulated (s) | over budget | bound (s) |"
          " bound's reason |")
    print("|---|---|---|---|---|---|---|---|")
    # A budget no plan can hold has no bound (the summary's infinity reads as null).
    share = lambda s: "–" if s is None else f"{s:.3f} ({args.ideal / s:.1%})"  # noqa: E731
    with tempfile.TemporaryDirectory() as workdir:
        for index, (name, trace, compute) in enumerate(args.configs):
            if trace.suffix == ".xz":
                plain = pathlib.Path(workdir) / f"trace-{index}.tiotrace"
                plain.write_bytes(lzma.decompress(trace.read_bytes()))
                trace = plain
            profiled = simulate(cli, trace, args, 1.0, workdir, budget=UNBOUNDED)[0]["ideal_s"]
            scale = compute / profiled
            result, reason = simulate(cli, trace, args, scale, workdir)
            print(f"| {name} | {profiled:.3f} | {compute:.3f} | {scale:.3f} | {share(result['step_s'])} | "
                  f"{result['violations']} | {share(result['bound_s'])} | {reason[:300]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
