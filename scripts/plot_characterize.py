#!/usr/bin/env python3
"""Plots the CSV files of `teraio characterize` (memory.csv, sizes.csv, inactive_cdf.csv)
into memory.png, sizes.png and inactive_cdf.png in the same directory.

Usage: plot_characterize.py DIR
Exit status: 0 done, 2 bad usage or input, 3 matplotlib is missing.
"""
import csv
import os
import sys


MAX_POINTS = 5000
UNITS = [("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0), ("bytes", 1.0)]


def binned_max(values, stride):
    return [max(values[i : i + stride]) for i in range(0, len(values), stride)]


def read_csv(directory, name):
    with open(os.path.join(directory, name), newline="") as f:
        return list(csv.DictReader(f))


def plot_memory(plt, directory):
    rows = read_csv(directory, "memory.csv")
    if not rows:
        raise ValueError("memory.csv has no operator")
    peak = max(int(r["demand_bytes"]) for r in rows)
    unit, scale = next(((u, s) for u, s in UNITS if peak >= s), UNITS[-1])
    # Each operator spans [k, k+1): the extra point closes the last step.
    ops = [int(r["op"]) for r in rows] + [len(rows)]
    demand = [int(r["demand_bytes"]) / scale for r in rows]
    active = [int(r["active_bytes"]) / scale for r in rows]
    share = [100.0 * float(r["active_share"]) for r in rows]
    demand, active, share = demand + demand[-1:], active + active[-1:], share + share[-1:]
    mean = sum(share[:-1]) / (len(share) - 1)
    title = "Memory demand per operator vs. bytes the operator touches"
    if len(ops) > MAX_POINTS:
        # Hundreds of thousands of steps draw slowly and unreadably: keep each bin's maximum.
        stride = -(-len(ops) // MAX_POINTS)
        ops = ops[::stride]
        demand, active, share = (binned_max(v, stride) for v in (demand, active, share))
        title += f" (max per {stride} operators)"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    top.fill_between(ops, demand, step="post", alpha=0.35, color="tab:blue", label="memory demand")
    top.plot(ops, active, drawstyle="steps-post", color="tab:red", linewidth=0.8, label="active (used by the operator)")
    top.set_ylabel(unit)
    top.set_title(title)
    top.legend(loc="upper right")
    top.grid(alpha=0.3)
    bottom.plot(ops, share, drawstyle="steps-post", color="tab:red", linewidth=0.8)
    bottom.axhline(mean, color="black", linestyle="--", linewidth=0.8, label=f"mean {mean:.2f}%")
    bottom.set_ylabel("active share (%)")
    bottom.set_xlabel("operator index")
    bottom.legend(loc="upper right")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "memory.png"), dpi=120)
    plt.close(fig)


def plot_sizes(plt, directory):
    rows = read_csv(directory, "sizes.csv")
    labels = [r["bucket"] for r in rows]
    tensors = [int(r["tensors"]) for r in rows]
    total_tensors = max(sum(tensors), 1)
    total_bytes = max(sum(int(r["bytes"]) for r in rows), 1)
    by_count = [100.0 * t / total_tensors for t in tensors]
    by_bytes = [100.0 * int(r["bytes"]) / total_bytes for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = range(len(labels))
    width = 0.4
    bars = ax.bar([i - width / 2 for i in x], by_count, width, label="share of tensors", color="tab:blue")
    ax.bar([i + width / 2 for i in x], by_bytes, width, label="share of bytes", color="tab:orange")
    for bar, count in zip(bars, tensors):
        ax.annotate(str(count), (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels)
    ax.set_ylabel("%")
    ax.set_xlabel("tensor size (numbers on bars: tensor count)")
    ax.set_title("Tensor size mix")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "sizes.png"), dpi=120)
    plt.close(fig)


def plot_inactive_cdf(plt, directory):
    rows = read_csv(directory, "inactive_cdf.csv")
    buckets = {}
    for r in rows:
        buckets.setdefault(r["bucket"], ([], []))
        buckets[r["bucket"]][0].append(float(r["idle_s"]) * 1000.0)
        buckets[r["bucket"]][1].append(float(r["cdf"]))
    periods = {r["bucket"]: int(r["inactive_periods"]) for r in read_csv(directory, "sizes.csv")}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, count in periods.items():
        if label not in buckets:
            ax.plot([], [], " ", label=f"{label}: no inactive period")
            continue
        idle_ms, cdf = buckets[label]
        # A log axis cannot show zero-length idle times; they sit at the left edge.
        idle_ms = [max(v, 1e-3) for v in idle_ms]
        ax.plot(idle_ms, cdf, drawstyle="steps-post", label=f"{label} ({count} periods)")
    ax.axvline(10.0, color="black", linestyle="--", linewidth=0.8, label="10 ms")
    ax.set_xscale("log")
    ax.set_xlabel("inactive period length (ms, log scale)")
    ax.set_ylabel("CDF")
    ax.set_ylim(0, 1.02)
    ax.set_title("Inactive-period lengths by tensor size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "inactive_cdf.png"), dpi=120)
    plt.close(fig)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_characterize: matplotlib is not available to {sys.executable}: {e}", file=sys.stderr)
        return 3
    directory = argv[1]
    try:
        plot_memory(plt, directory)
        plot_sizes(plt, directory)
        plot_inactive_cdf(plt, directory)
    except (OSError, KeyError, ValueError) as e:
        print(f"plot_characterize: cannot plot {directory}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
