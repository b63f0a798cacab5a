"""Session 40, offline: how two runs' profiled operator times differ (RESULTS.md, session 40).

Each CSV is `teraio simulate TRACE PLAN --enforce-budget --budget 74GiB --csv ops.csv` on one
run's saved trace and plan; both traces must list the same operators. Prints the total
difference (A - B), by phase, by operator name, and by size of the difference per operator.
Usage: /usr/bin/python3 op_times.py A.csv B.csv
"""
import collections
import csv
import sys


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main(a_path, b_path):
    a, b = load(a_path), load(b_path)
    if len(a) != len(b):
        sys.exit(f"the traces differ in length: {len(a)} against {len(b)} operators")
    diffs = []
    by_phase, by_name = collections.Counter(), collections.Counter()
    for x, y in zip(a, b):
        if x["name"] != y["name"]:
            sys.exit(f"operator {x['op']} differs: {x['name']} against {y['name']}")
        d = float(x["duration_s"]) - float(y["duration_s"])
        diffs.append((d, int(x["op"]), x["name"], x["phase"]))
        by_phase[x["phase"]] += d
        by_name[x["name"]] += d
    print(f"{len(a)} operators: A - B = {sum(d for d, *_ in diffs):+.3f} s")
    print("by phase: " + ", ".join(f"{k} {v:+.3f} s" for k, v in by_phase.most_common()))
    print("by name (largest 10): " + ", ".join(f"{k} {v:+.3f} s" for k, v in by_name.most_common(10)))
    for lo, hi in ((0, 1e-4), (1e-4, 1e-3), (1e-3, 1e-2), (1e-2, float("inf"))):
        band = [d for d, *_ in diffs if lo <= d < hi]
        print(f"longer by {lo * 1e3:g}-{hi * 1e3:g} ms: {len(band)} operators, {sum(band):.3f} s")


if __name__ == "__main__":
    main(*sys.argv[1:3])
