"""Where a planned step's device stall went, against where the plan's simulation put it.

The runtime times every wait for a copy that it queues on the compute stream
(`Session.device_waits()`: operator, kind, seconds, since session 37 where the copy stood:
queued, flushed or gated, and since session 38 when the GPU reached it); `teraio simulate TRACE
PLAN --timeline T`
writes the simulated step, each operator with the stall before it. This lines the two up by
operator and by stretch of the step (each micro-batch's forward and backward, the optimizer), so
that a runtime trailing its plan shows where it loses the time: everywhere a little (a per-copy
latency) or in a few places (a plan the runtime cannot follow there). With the GPU times of the
waits it also sets the GPU time between them against the profile's operator times: where the
step runs longer than its waits and its plan's compute account for. And it splits the copy-in
waits by the simulated slack of the prefetches due (session 39): waits at the plan's tight spots
against waits for copies the simulation lands 10 ms or more ahead, which the plan does not explain.

  python3 bench/device_stalls.py W3-79GiB-teraio-recompute-device-waits.json \\
      --trace W3-79GiB-teraio-recompute-trace.tiotrace --plan W3-79GiB-teraio-recompute-plan.json
  python3 bench/device_stalls.py WAITS.json --timeline simulated-timeline.json
  python3 bench/device_stalls.py WAITS.json --plan PLAN.json     # no simulation: the splits only

The simulation keeps the budget as the runtime does (`--enforce-budget`: reactive eviction
covers what the plan leaves over it, as in the session's prediction). A plan made with
Session(plan_margin=...) (64 MiB by default since session 32) records the budget less the
margin: pass the session's budget (`--budget 74GiB`) to simulate what the runtime enforced.
Other options after these go to `teraio simulate` as they are.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import pathlib
import subprocess
import sys
import tempfile

KINDS = ("copy in", "copy out", "abandoned copy out")
DEFAULT_TERAIO = pathlib.Path(__file__).resolve().parents[1] / "build" / "release" / "tools" / "teraio" / "teraio"


class SimulatedOp(collections.namedtuple("SimulatedOp", "name phase start_s end_s stall_s")):
    """One operator of the simulated step (times in seconds from the step's start)."""


def simulated_ops(timeline):
    """{op index: SimulatedOp} from the Chrome trace-event JSON of `teraio simulate --timeline`."""
    ops = {}
    for event in timeline["traceEvents"]:
        args = event.get("args", {})
        if event.get("ph") == "X" and "op" in args:
            start = event["ts"] / 1e6
            ops[int(args["op"])] = SimulatedOp(event["name"], event.get("cat", "other"), start,
                                               start + event["dur"] / 1e6, args.get("stall_us", 0) / 1e6)
    if not ops:
        raise ValueError("the timeline has no operators: is it teraio simulate's --timeline output?")
    return ops


def measured_by_op(waits):
    """{op index: {kind: seconds}} from Session.device_waits()'s (op, kind, seconds[, how])."""
    by_op = collections.defaultdict(lambda: dict.fromkeys(KINDS, 0.0))
    for op, kind, seconds, *_ in waits:
        if kind not in KINDS:
            raise ValueError(f"unknown device wait kind {kind!r}")
        by_op[int(op)][kind] += seconds
    return dict(by_op)


def by_how(waits):
    """{how: [waits, seconds]}: where each waited-for copy stood as the wait was queued ("queued",
    "flushed", "gated", "done"; session 37 on), copies in and out. Abandoned copies out are left
    out (the runtime tags them all "flushed"). Empty for waits recorded without it."""
    how = collections.defaultdict(lambda: [0, 0.0])
    for _, kind, seconds, *rest in waits:
        if rest and kind != "abandoned copy out":
            how[rest[0]][0] += 1
            how[rest[0]][1] += seconds
    return dict(how)


TINY_BYTES = 64 << 10


def prefetches_due(migrations):
    """{operator: [bytes of each prefetch the plan has due there]}."""
    due = collections.defaultdict(list)
    for m in migrations or []:
        if m["direction"] == "prefetch":
            due[m["deadline"]].append(m["bytes"])
    return due


def by_copy_due(waits, migrations):
    """Copy-in seconds split by what the plan (its "migrations") has due at the waiting operator:
    every prefetch due there under 64 KiB, one of 64 KiB or more, or no prefetch due there (a copy
    in the plan has due elsewhere, or a fetch on demand). Session 37 found W3's copy-in waits
    about half at operators where only tiny copies were due."""
    largest = {op: max(sizes) for op, sizes in prefetches_due(migrations).items()}
    split = {"under 64 KiB": 0.0, "64 KiB or more": 0.0, "no prefetch due there": 0.0}
    for op, kind, seconds, *_ in waits:
        if kind != "copy in":
            continue
        due = largest.get(op)
        split["no prefetch due there" if due is None else "under 64 KiB" if due < TINY_BYTES else "64 KiB or more"] += seconds
    return split


SLACK_BANDS = ((0.0, "under 0.5 ms"), (5e-4, "0.5-10 ms"), (1e-2, "10 ms or more"))


def slack_band(left):
    """The band of SLACK_BANDS a slack falls in (below 0.5 ms, negative ones included, the first)."""
    return next(name for low, name in reversed(SLACK_BANDS) if left >= low or low == SLACK_BANDS[0][0])


def prefetch_slack(timeline, ops):
    """({op index: slack in seconds}, {(tensor, op index): (slack, bytes)}): for each operator
    with a prefetch due, the least time any of them had between its copy's simulated end and the
    operator's simulated start (negative where the simulation stalls for it), and each such
    prefetch's own, from `teraio simulate --timeline`'s migration events."""
    slack, by_tensor = {}, {}
    for event in timeline["traceEvents"]:
        args = event.get("args", {})
        if event.get("cat") != "migration" or not event.get("name", "").startswith("prefetch"):
            continue
        op = ops.get(int(args.get("deadline", -1)))
        if op is None:
            continue
        left = op.start_s - (event["ts"] + event["dur"]) / 1e6
        k = int(args["deadline"])
        slack[k] = min(slack.get(k, left), left)
        if "tensor" in args:
            by_tensor[(int(args["tensor"]), k)] = (left, args.get("bytes"))
    return slack, by_tensor


def by_slack(waits, slack, migrations=None, worst=8, by_tensor=None):
    """Copy-in waits split by the simulated slack of the prefetches due at the waiting operator:
    the plan's own tight spots (under 0.5 ms) against copies the simulation lands 10 ms or more
    ahead, where a wait over 1 ms is one the plan does not explain (session 39: single 16 MiB
    copies with 10-41 ms of slack waiting 15-43 ms, in every W3 run). A wait that names its
    tensor (the sixth element, session 39 on) is set against that tensor's prefetch (by_tensor,
    from prefetch_slack); one that does not, against the tightest prefetch due there. With the
    plan's migrations, the worst of those name the bytes due."""
    by_tensor = by_tensor or {}
    waited = collections.defaultdict(float)
    for op, kind, seconds, *rest in waits:
        if kind == "copy in":
            tensor = rest[2] if len(rest) >= 3 and (rest[2], int(op)) in by_tensor else None
            waited[(int(op), tensor)] += seconds
    due = {op: sum(sizes) for op, sizes in prefetches_due(migrations).items()}
    bands = {name: [0, 0.0] for _, name in SLACK_BANDS}
    bands["no prefetch due there"] = [0, 0.0]
    unexplained = []
    for (op, tensor), seconds in waited.items():
        left, size = by_tensor[(tensor, op)] if tensor is not None else (slack.get(op), due.get(op))
        if left is None:
            band = "no prefetch due there"
        else:
            band = slack_band(left)
            if band == SLACK_BANDS[-1][1] and seconds > 1e-3:
                unexplained.append((seconds, op, left, size, tensor))
        bands[band][0] += 1
        bands[band][1] += seconds
    unexplained.sort(key=lambda u: -u[0])
    return {"bands": bands, "unexplained_s": sum(u[0] for u in unexplained), "unexplained": len(unexplained),
            "worst": [{"op": op, "waited_s": s, "slack_s": left, "bytes_due": size, "tensor": tensor}
                      for s, op, left, size, tensor in unexplained[:worst]]}


def slack_text(report):
    """Text lines for by_slack's report."""
    if not report:
        return []
    lines = ["copy-in waits by the simulated slack of their prefetch (the tightest due at the operator where a wait "
             "does not name its tensor): " + ", ".join(
        f"{name} {n} waits {s:.3f} s" for name, (n, s) in report["bands"].items())]
    lines.append(f"  waits over 1 ms for prefetches with 10 ms or more of slack: {report['unexplained']}, "
                 f"{report['unexplained_s']:.3f} s")
    for w in report["worst"]:
        size = f", {w['bytes_due'] / 2**20:.1f} MiB due" if w["bytes_due"] is not None else ""
        tensor = f" (tensor {w['tensor']})" if w["tensor"] is not None else ""
        lines.append(f"  op {w['op']}: waited {w['waited_s'] * 1e3:.1f} ms, simulated slack {w['slack_s'] * 1e3:.1f} ms"
                     f"{size}{tensor}")
    return lines


def between_waits(waits, ops, worst=10):
    """The GPU time between consecutive waits against the profile's operator times between them
    (`at`, the fifth element of Session.device_waits() since session 38: when the GPU reached
    each wait). The end of one wait to the start of the next is time the compute stream spent on
    the operators from the first wait's operator up to the next one's; anything beyond their
    simulated (profiled) durations is time the plan does not count: the GPU waiting for the host,
    kernels slower than in the profile step, waits the clock does not see. Session 38 found W3's
    steps 0.7-2.1 s longer than their waits and their plan's compute, growing with the traffic.
    Per stretch (by the earlier wait's operator), the intervals that lost most, and how much of
    the excess sits in intervals over 1 ms. None for waits recorded without `at`."""
    timed = sorted((w[4], int(w[0]), w[2]) for w in waits if len(w) >= 5)
    if len(timed) < 2:
        return None
    top = max(max(ops), max(op for _, op, _ in timed)) + 1
    cumulative = [0.0] * (top + 1)  # cumulative[k]: profiled seconds of operators before k
    for k in range(top):
        op = ops.get(k)
        cumulative[k + 1] = cumulative[k] + (op.end_s - op.start_s if op else 0.0)
    ranges = stretches(ops)
    rows = [{"stretch": name, "gpu_s": 0.0, "profiled_s": 0.0, "intervals": 0} for name, _, _ in ranges]
    firsts = [first for _, first, _ in ranges]
    intervals, backwards = [], 0
    for (at, op, seconds), (later, next_op, _) in zip(timed, timed[1:]):
        if next_op < op:  # a wait queued for an earlier operator (not expected on one stream)
            backwards += 1
            continue
        gpu = later - (at + seconds)
        profiled = cumulative[next_op] - cumulative[op]
        row = rows[max(0, bisect.bisect_right(firsts, op) - 1)]
        row["gpu_s"] += gpu
        row["profiled_s"] += profiled
        row["intervals"] += 1
        intervals.append((gpu - profiled, op, next_op))
    for row in rows:
        row["excess_s"] = row["gpu_s"] - row["profiled_s"]
    excess = sum(e for e, _, _ in intervals)
    intervals.sort(reverse=True)
    return {"first_op": timed[0][1], "last_op": timed[-1][1],
            "gpu_s": sum(r["gpu_s"] for r in rows), "profiled_s": sum(r["profiled_s"] for r in rows),
            "excess_s": excess, "excess_in_gaps_over_1ms_s": sum(e for e, _, _ in intervals if e > 1e-3),
            "gaps_over_1ms": sum(1 for e, _, _ in intervals if e > 1e-3), "intervals": len(intervals),
            "out_of_order": backwards, "stretches": [r for r in rows if r["intervals"]],
            "worst": [{"excess_s": e, "from_op": a, "to_op": b,
                       "names": sorted({ops[k].name for k in range(a, min(b + 1, a + 6)) if k in ops})}
                      for e, a, b in intervals[:worst]]}


def between_text(report, min_s=0.01):
    """Text lines for between_waits' report (nothing when None)."""
    if not report:
        return []
    lines = [f"between the waits (ops {report['first_op']}-{report['last_op']}, {report['intervals']} intervals): "
             f"GPU {report['gpu_s']:.3f} s against the profile's {report['profiled_s']:.3f} s, "
             f"{report['excess_s']:+.3f} s; {report['excess_in_gaps_over_1ms_s']:+.3f} s of it in "
             f"{report['gaps_over_1ms']} intervals over 1 ms beyond the profile"]
    if report["out_of_order"]:
        lines.append(f"({report['out_of_order']} waits queued for an earlier operator than the one before: skipped)")
    lines += [f"  {r['stretch']:<20} GPU {r['gpu_s']:7.3f} s, profile {r['profiled_s']:7.3f} s, {r['excess_s']:+.3f} s"
              for r in report["stretches"] if abs(r["excess_s"]) >= min_s]
    lines.append("intervals that ran longest beyond the profile:")
    lines += [f"  ops {w['from_op']}-{w['to_op']} ({', '.join(w['names'])}): {w['excess_s'] * 1e3:+.2f} ms"
              for w in report["worst"]]
    return lines


def stretches(ops):
    """Runs of consecutive operators of one phase, named as they come: 'forward 1',
    'backward 1', 'forward 2', ..., 'optimizer 1'. Returns [(name, first op, last op)]."""
    runs, seen = [], collections.Counter()
    for k in sorted(ops):
        phase = ops[k].phase
        if runs and runs[-1][0] == phase:
            runs[-1][2] = k
        else:
            seen[phase] += 1
            runs.append([phase, k, k, seen[phase]])
    return [(f"{phase} {n}", first, last) for phase, first, last, n in runs]


def compare(waits, ops, worst=15):
    """The measured waits against the simulated stalls: totals, per stretch, and the operators
    where the runtime waited longest beyond its simulation."""
    measured = measured_by_op(waits)
    unknown = sorted(k for k in measured if k not in ops)
    total = {kind: sum(m[kind] for m in measured.values()) for kind in KINDS}
    rows = []
    for name, first, last in stretches(ops):
        ks = [k for k in range(first, last + 1) if k in ops]
        row = {"stretch": name, "first_op": first, "last_op": last,
               "simulated_start_s": ops[first].start_s, "simulated_end_s": ops[last].end_s,
               "simulated_stall_s": sum(ops[k].stall_s for k in ks)}
        for kind in KINDS:
            row[kind] = sum(measured[k][kind] for k in ks if k in measured)
        rows.append(row)
    excess = []
    for k, m in measured.items():
        sim = ops[k].stall_s if k in ops else 0.0
        excess.append((sum(m.values()) - sim, k))
    excess.sort(reverse=True)
    top = [{"op": k, "name": ops[k].name if k in ops else "?", "phase": ops[k].phase if k in ops else "?",
            **measured[k], "simulated_stall_s": ops[k].stall_s if k in ops else 0.0} for _, k in excess[:worst]]
    return {"measured_s": total, "measured_total_s": sum(total.values()),
            "simulated_total_s": sum(op.stall_s for op in ops.values()),
            "ops_with_waits": len(measured), "ops_with_simulated_stall": sum(1 for op in ops.values() if op.stall_s > 0),
            "unknown_ops": unknown, "stretches": rows, "worst": top}


def describe(report, min_s=0.01):
    """Text lines: totals, the stretches with at least `min_s` of stall either way, the worst ops."""
    m = report["measured_s"]
    lines = [f"measured device stall {report['measured_total_s']:.3f} s (copy in {m['copy in']:.3f}, copy out "
             f"{m['copy out']:.3f}, abandoned {m['abandoned copy out']:.3f}) over {report['ops_with_waits']} "
             f"operators; simulated {report['simulated_total_s']:.3f} s over {report['ops_with_simulated_stall']}"]
    if report["unknown_ops"]:
        lines.append(f"{len(report['unknown_ops'])} operators with waits are not in the simulated step "
                     f"(first {report['unknown_ops'][0]}): trace and waits from different runs?")
    lines.append("stretch              ops              simulated at (s)   simulated   measured in   out")
    quiet = 0
    for r in report["stretches"]:
        measured = r["copy in"] + r["copy out"] + r["abandoned copy out"]
        if max(measured, r["simulated_stall_s"]) < min_s:
            quiet += 1
            continue
        lines.append(f"{r['stretch']:<20} {r['first_op']:>6}-{r['last_op']:<8} {r['simulated_start_s']:7.3f}-"
                     f"{r['simulated_end_s']:<8.3f} {r['simulated_stall_s']:9.3f} {r['copy in']:13.3f} "
                     f"{r['copy out'] + r['abandoned copy out']:5.3f}")
    if quiet:
        lines.append(f"({quiet} stretches with less than {min_s * 1e3:.0f} ms either way left out)")
    lines += split_text(report.get("by_how"), report.get("copy_in_by_due"))
    lines.append("operators that waited longest beyond their simulated stall:")
    for w in report["worst"]:
        lines.append(f"  op {w['op']} {w['name']} ({w['phase']}): in {w['copy in']:.4f} s, out "
                     f"{w['copy out'] + w['abandoned copy out']:.4f} s, simulated {w['simulated_stall_s']:.4f} s")
    return lines


def split_text(how, due):
    """Text lines for by_how's and by_copy_due's splits (each left out when None or empty)."""
    lines = []
    if how:
        lines.append("where each copy stood as the wait was queued: " + ", ".join(
            f"{h} {n} waits {s:.3f} s" for h, (n, s) in sorted(how.items())))
    if due:
        lines.append("copy-in waits by the largest prefetch due at the operator: " + ", ".join(
            f"{k} {s:.3f} s" for k, s in due.items()))
    return lines


def split_lines(waits, migrations):
    """Text lines without a simulation: the measured waits by kind, by where their copy stood, and
    the copy-in waits by the largest prefetch due at the operator."""
    kinds = collections.Counter()
    for _, kind, seconds, *_ in waits:
        kinds[kind] += seconds
    return (["measured device stall by kind: " + ", ".join(f"{k} {kinds[k]:.3f} s" for k in KINDS)]
            + split_text(by_how(waits), by_copy_due(waits, migrations)))


def simulate(teraio, trace, plan, extra):
    """Runs `teraio simulate` for the timeline; returns it parsed."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "timeline.json"
        enforce = [] if "--enforce-budget" in extra else ["--enforce-budget"]
        subprocess.run([str(teraio), "simulate", str(trace), str(plan), "--timeline", str(path), *enforce, *extra],
                       check=True, stdout=subprocess.DEVNULL)
        return json.loads(path.read_text())


def load_waits(path, step=None):
    """The waits of one measured step (the last, or the one numbered `step`) of train_llm's
    --save-trace waits file."""
    steps = json.loads(pathlib.Path(path).read_text())["steps"]
    if not steps:
        raise ValueError(f"{path}: no measured steps")
    chosen = steps[-1] if step is None else next((s for s in steps if s["step"] == step), None)
    if chosen is None:
        raise ValueError(f"{path}: no step {step} (steps {[s['step'] for s in steps]})")
    return chosen


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("waits", help="train_llm.py --save-trace's *-device-waits.json")
    p.add_argument("--step", type=int, help="the measured step to read (default: the last)")
    p.add_argument("--timeline", help="a simulated timeline (teraio simulate --timeline) instead of --trace/--plan")
    p.add_argument("--trace", help="the trace the plan was made from (*-trace.tiotrace)")
    p.add_argument("--plan", help="the plan the step ran (*-plan.json)")
    p.add_argument("--teraio", default=str(DEFAULT_TERAIO), help="the teraio CLI (default: the release build's)")
    p.add_argument("--worst", type=int, default=15, help="operators to list (default 15)")
    p.add_argument("--json", help="also write the comparison here")
    args, extra = p.parse_known_args(argv)
    if args.timeline is None and args.plan is None:
        p.error("give --timeline, or --trace and --plan to simulate, or --plan alone for the splits only")
    step = load_waits(args.waits, args.step)
    migrations = json.loads(pathlib.Path(args.plan).read_text())["migrations"] if args.plan else None
    print(f"step {step['step']}: {step['time_s']:.3f} s, device stall {step['device_stall_s']:.3f} s")
    if args.timeline is None and args.trace is None:
        # Where the teraio CLI is not at hand (a GPU call whose module was carried, not built).
        print("\n".join(split_lines(step["waits"], migrations)))
        return 0
    timeline = (json.loads(pathlib.Path(args.timeline).read_text()) if args.timeline
                else simulate(args.teraio, args.trace, args.plan, extra))
    ops = simulated_ops(timeline)
    report = compare(step["waits"], ops, args.worst)
    report["step"] = step["step"]
    report["by_how"] = by_how(step["waits"])
    if migrations is not None:
        report["copy_in_by_due"] = by_copy_due(step["waits"], migrations)
    report["between_waits"] = between_waits(step["waits"], ops, args.worst)
    slack, by_tensor = prefetch_slack(timeline, ops)
    report["copy_in_by_slack"] = by_slack(step["waits"], slack, migrations, by_tensor=by_tensor)
    print("\n".join(describe(report) + slack_text(report["copy_in_by_slack"]) + between_text(report["between_waits"])))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
