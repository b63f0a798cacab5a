"""The tables of bench/train_llm.py: each mode's summary (median step, share of ideal, bytes moved,
the model's error, exactness against ideal), the ideal extrapolated by layer, the markdown table
with its heading and notes, and the share-of-ideal plot."""

import contextlib
import json
import pathlib
import statistics
import sys

import host_watch  # bench/host_watch.py
import link_activity  # bench/link_activity.py

GIB = 1 << 30


def fmt_size(n):
    if n is None:
        return "–"
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def share_text(share):
    """A share of the budget as 1/N when it is one (min_migration_share's 1/65536), else as is."""
    whole = round(1 / share)
    return f"1/{whole}" if abs(share * whole - 1) < 1e-9 else f"{share:g}"


def median_of(steps, key):
    values = [s[key] for s in steps if s.get(key) is not None]
    return statistics.median(values) if values else None


def extrapolate_ideal(runs, counts, layers):
    """The line through (L1, t1) and (L2, t2), predicted at `layers` and checked at L3."""
    times = [median_of([s for s in runs[c]["steps"] if s["measured"]], "time_s") if runs[c]["status"] == "ok"
             else None for c in counts]
    if times[0] is None or times[1] is None:
        failed = ", ".join(f"{c} layers: {runs[c]['status']}" for c in counts[:2] if runs[c]["status"] != "ok")
        return {"status": f"error: extrapolation failed ({failed})", "step_s": None}
    slope = (times[1] - times[0]) / (counts[1] - counts[0])
    intercept = times[0] - slope * counts[0]
    check = intercept + slope * counts[2]
    return {"status": "ok", "step_s": intercept + slope * layers, "intercept_s": intercept, "per_layer_s": slope,
            "layer_counts": counts, "measured_s": times, "check_predicted_s": check,
            "check_error": check / times[2] - 1 if times[2] else None}


def summarize(result, ideal_s, ideal_losses):
    steps = [s for s in result["steps"] if s["measured"]]
    median = median_of(steps, "time_s") if result["status"] == "ok" else None
    predicted = ((result.get("teraio") or {}).get("predictions") or {}).get("predicted_step_s")
    return {
        "median_step_s": median,
        "share_of_ideal": ideal_s / median if ideal_s and median else None,
        "peak_allocated": result.get("peak_allocated"),
        "peak_reserved": result.get("peak_reserved"),
        "pinned_host_peak": result.get("pinned_host_peak"),
        **{key: median_of(steps, key) for key in ("bytes_to_host", "bytes_from_host", "bytes_to_ssd",
                                                   "bytes_from_ssd", "stall_s", "device_stall_s", "demand_fetches",
                                                   "callback_s", "bytes_dropped", "gc_s", "gc_collections", "alloc_retries",
                                                   "device_allocs", "device_frees", "fetch_flushes", "fetch_flush_s",
                                                   *(f"paged_{name}" for name in host_watch.PAGED_COUNTERS))},
        "link": link_activity.median(steps),
        "predicted_step_s": predicted,
        "model_error": predicted / median - 1 if predicted and median else None,
        "exact": same_losses(result, ideal_losses),
        "exact_steps": sum(s["step"] in ideal_losses for s in result["steps"]) if ideal_losses else 0,
    }


def same_losses(result, ideal_losses):
    """Every loss equal to ideal's bit for bit over the steps both ran; None where not comparable."""
    if ideal_losses is None or result["status"] != "ok" or result["mode"] == "ideal":
        return None
    common = [s for s in result["steps"] if s["step"] in ideal_losses]
    return bool(common) and all(s["loss_hex"] == ideal_losses[s["step"]] for s in common)


def table_markdown(table):
    header = ("| mode | status | step (s) | share of ideal | peak alloc | peak reserved | pinned host"
              " | host out/in per step | SSD out/in per step | stall (s) | device stall (s) | predicted (s)"
              " | model error | demand fetches | exact |")
    lines = [header, "|" + "---|" * 15]
    for name, entry in table["modes"].items():
        s = entry["summary"]
        lines.append("| " + " | ".join([
            name, entry["status"] + (" (close failed: see JSON)" if entry.get("close_error") else ""), _num(s["median_step_s"], "{:.3f}"), _num(s["share_of_ideal"], "{:.1%}"),
            fmt_size(s["peak_allocated"]), fmt_size(s["peak_reserved"]), fmt_size(s["pinned_host_peak"]),
            _pair(s["bytes_to_host"], s["bytes_from_host"]), _pair(s["bytes_to_ssd"], s["bytes_from_ssd"]),
            _num(s["stall_s"], "{:.3f}"), _num(s["device_stall_s"], "{:.3f}"), _num(s["predicted_step_s"], "{:.3f}"),
            _num(s["model_error"], "{:+.1%}"), _num(s["demand_fetches"], "{:g}"),
            "ref" if name == "ideal" and s["median_step_s"] and not table["extrapolation"] else _exact(entry),
        ]) + " |")
    return "\n".join(lines)


def _exact(entry):
    """The exactness verdict, saying over how many steps where ideal ran fewer than the mode (a
    tuned mode's measured steps come after its tuning steps)."""
    s = entry["summary"]
    compared, ran = s.get("exact_steps", 0), len(entry["steps"])
    if s["exact"] is None or not compared or compared >= ran:
        return _num(s["exact"], "{}")
    return f"{s['exact']} ({compared} of {ran} steps)"


def table_notes(table):
    """What a mode chose or did on its own (teraio-recompute's count, teraio.recast), below the table."""
    notes = [f"- {name}: {entry['recompute']['summary']}" for name, entry in table["modes"].items()
             if entry.get("recompute")]
    notes += [f"- {name}: teraio.recast: {entry['recast']}" for name, entry in table["modes"].items()
              if entry.get("recast")]
    for name, entry in table["modes"].items():
        if held_up := host_watch.describe(entry.get("summary", {})):
            notes.append(f"- {name}: {held_up}")
    for name, entry in table["modes"].items():
        plan = (entry.get("teraio") or {}).get("plan") or {}
        if plan.get("hardware"):
            rounds = f"; stall search: {plan['stall_rounds']} round(s)" if "stall_rounds" in plan else ""
            margin = f"; {plan['plan_margin_bytes'] / 2**20:g} MiB kept free below the budget" \
                if plan.get("plan_margin_bytes") else ""
            lead = f"; prefetches moved up to {plan['early_prefetch_lead']:g} transfer times earlier" \
                if plan.get("early_prefetch_lead") is not None else ""
            share = plan.get("min_migration_share")
            smallest = f"; storages under {share_text(share)} of the budget never planned to move" if share else ""
            notes.append(f"- {name}: planned for {plan['hardware']}{margin}{lead}{smallest}{rounds}")
        if engine := ((entry.get("teraio") or {}).get("backends") or "").splitlines():
            # What ran: the copier, its order and its polling threads' timer slack, as the engine says.
            notes.append(f"- {name}: {engine[0]}")
        if plan.get("retimed_steps"):
            notes.append(f"- {name}: planned again on the operator times of {plan['retimed_steps']} planned step(s): "
                         f"operators {plan['profiled_step_s_before_retime']:.3f} s -> {plan['profiled_step_s']:.3f} s, "
                         f"predicted step {plan['predicted_step_s_before_retime']:.3f} s -> "
                         f"{plan['predicted_step_s']:.3f} s")
    workspaces = {entry["cublas_workspace"] for entry in table["modes"].values() if entry.get("cublas_workspace")}
    notes += [f"- cuBLAS workspace (every mode): {workspace}" for workspace in sorted(workspaces)]
    syncs = {entry["host_syncs"] for entry in table["modes"].values() if entry.get("host_syncs")}
    notes += [f"- host syncs in each micro-batch's forward (every mode): {what}" for what in sorted(syncs)]
    freezes = {name: entry["gc_freeze"] for name, entry in table["modes"].items() if entry.get("gc_freeze")}
    notes += [f"- {name}: Python's collector, {what}" for name, what in freezes.items()]
    allocators = {entry["allocator"] for entry in table["modes"].values() if entry.get("allocator")}
    notes += [f"- CUDA allocator: {allocator}" for allocator in sorted(allocators)]
    for name, entry in table["modes"].items():
        if (callbacks := entry.get("summary", {}).get("callback_s")) is not None:
            notes.append(f"- {name}: TeraIO's operator callbacks took {callbacks:.3f} s of host time per measured "
                         f"step (median)")
        if link := entry.get("summary", {}).get("link"):
            notes.append(f"- {name}: the PCIe link per measured step (median, from the copier's dispatchers): "
                         f"{link_activity.describe(link)}")
    return "\n" + "\n".join(notes) + "\n" if notes else ""


def _num(value, spec):
    return "–" if value is None else spec.format(value)


def _pair(out, back):
    return "–" if out is None and back is None else f"{fmt_size(out)} / {fmt_size(back)}"


def table_heading(table):
    w = table["workload_config"]
    lines = [
        f"## {table['workload']} at {table['budget'] or 'no cap'} on {table['device']}",
        "",
        f"- model: {table['model']}, {table['params'] / 1e6:,.1f} M parameters, {w['layers']} layers, hidden "
        f"{w['hidden']}, ffn {w['ffn']}, {w['heads']}/{w['kv_heads']} heads, vocab {w['vocab']}; model states "
        f"{fmt_size(table['model_states_bytes'])}",
        f"- step: {w['micro_batches']} x micro-batch {w['batch']} x {w['seq']}, {w['precision']}, AdamW "
        f"(one group per parameter), {table['args']['steps']} measured steps (median)",
        f"- cap: {table['cap']}; TeraIO gpu_budget {fmt_size(table['teraio_gpu_budget'])}, profile "
        f"{'records when each storage is freed (--release-tracking on)' if table['args'].get('release_tracking') == 'on' else 'counts every storage freed at its last use'}",
        f"- torch {table['torch']}, transformers {table['transformers']}, {table['date']}",
        f"- command: `{table['command']}`",
    ]
    if table["extrapolation"] and table["extrapolation"]["status"] == "ok":
        e = table["extrapolation"]
        lines.append(f"- ideal extrapolated from {e['layer_counts'][0]} and {e['layer_counts'][1]} layers: "
                     f"{e['intercept_s']:.3f} s + {e['per_layer_s']:.4f} s/layer; check at {e['layer_counts'][2]} "
                     f"layers: error {_num(e['check_error'], '{:+.1%}')}")
    return "\n".join(lines)


def plot_dir(out, mode_order=()):
    """One group of bars per table (workload and budget) in `out`: share of ideal per mode, the modes
    in `mode_order` first."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("train_llm: matplotlib is not installed (pip install matplotlib): no plot", file=sys.stderr)
        return 1
    tables = []
    for path in sorted(pathlib.Path(out).glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            table = json.loads(path.read_text())
            if isinstance(table, dict) and table.get("benchmark") == "train_llm":
                tables.append(table)
    if not tables:
        print(f"train_llm: no tables in {out} to plot", file=sys.stderr)
        return 1
    seen = [m for t in tables for m in t["modes"]]
    modes = [m for m in dict.fromkeys([*mode_order, *seen]) if m in seen]
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(tables) * len(modes) / 3), 4))
    for j, mode in enumerate(modes):
        for i, table in enumerate(tables):
            entry = table["modes"].get(mode)
            if entry is None:
                continue
            x = i - 0.4 + (j + 0.5) * width
            share = entry["summary"]["share_of_ideal"]
            if share is None:
                status = entry["status"].split(":")[0][:16]
                ax.text(x, 0.02, f"{mode}: {status}", rotation=90, ha="center", va="bottom", fontsize=7)
                continue
            ax.bar(x, share, width, color=f"C{j}", label=mode)
            ax.text(x, share, f"{share:.0%}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylim(0, 1.15 * max([1.0] + [b.get_height() for b in ax.patches]))
    ax.set_xticks(range(len(tables)))
    ax.set_xticklabels([f"{t['workload']} @ {t['budget'] or 'no cap'}" for t in tables])
    ax.set_ylabel("share of ideal (ideal step time / step time)")
    ax.set_title(f"Training throughput under a GPU budget ({tables[0]['device']})")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, ncol=min(4, len(unique)), loc="upper center",
              bbox_to_anchor=(0.5, -0.12))
    path = pathlib.Path(out) / "share_of_ideal.png"
    fig.savefig(path, dpi=150, bbox_inches="tight")
    print(f"written: {path}", flush=True)
    return 0
