#!/usr/bin/python3
"""Plots `teraio sweep` output: normalized performance (ideal / simulated step time) against
migration bandwidth, one line per GPU memory budget (the paper's roofline study)."""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv", help="CSV written by teraio sweep")
    parser.add_argument("-o", "--output", default="sweep.png", help="PNG to write")
    parser.add_argument("--title", default="Normalized performance vs migration bandwidth")
    args = parser.parse_args()

    lines = {}
    with open(args.csv, newline="") as f:
        for row in csv.DictReader(f):
            lines.setdefault(float(row["budget_gib"]), []).append(
                (float(row["bandwidth_gbps"]), float(row["normalized"]), row["feasible"] == "1",
                 float(row.get("bound", "nan"))))
    if not lines:
        print(f"plot_sweep: no points in {args.csv}", file=sys.stderr)
        return 1

    fig, ax = plt.subplots(figsize=(6, 4))
    for budget in sorted(lines, reverse=True):
        pts = sorted(lines[budget])
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"budget {budget:.1f} GiB")
        ax.plot([p[0] for p in pts], [min(p[3], 1.0) for p in pts], linestyle=":", color=line.get_color(),
                label=f"bandwidth bound, {budget:.1f} GiB")
        infeasible = [p for p in pts if not p[2]]
        if infeasible:
            ax.scatter([p[0] for p in infeasible], [p[1] for p in infeasible], marker="x", color="red", zorder=3)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
    ax.set_xlabel("migration bandwidth per direction (GB/s)")
    ax.set_ylabel("normalized performance (ideal / step time)")
    ax.set_ylim(0, 1.05)
    ax.set_title(args.title)
    ax.grid(True, alpha=0.3)
    ax.legend(title="x: plan misses the budget (kept by eviction)", fontsize=8, title_fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
