#!/usr/bin/env python3
"""Checkpoint loading: TeraIO against the safetensors library and the raw disk (dd, O_DIRECT).

Generates once (if absent) a synthetic Llama-like bf16 checkpoint of --size in --shards shards
with a model.safetensors.index.json under --dir, and never deletes it (large deletes stall the
disk). Then, in one run, --repeat times each (medians reported):
  cold (page cache dropped before every measurement):
    teraio       teraio.safetensors.load(dir, device)
    safetensors  safetensors.torch.load_file(shard, device) over the shards (when installed)
    dd           dd iflag=direct bs=16M of=/dev/null: one per shard in parallel, and one after another
  warm (after a warm-up read of every shard): teraio and safetensors again.
TeraIO's tensors are checked equal (torch.equal) to the safetensors library's, or, without it,
to an independent reading of the files. Targets: cold TeraIO >= 0.9 x the raw disk bandwidth
(the better dd figure); warm TeraIO >= 5 x safetensors.

GPU machine:  python3 bench/load_safetensors.py --json build/st-bench.json
CPU smoke:    python3 bench/load_safetensors.py --device cpu --size 64MiB --repeat 1
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time

import numpy as np
import torch

from teraio import safetensors as st
import teraio

try:
    from tqdm import tqdm
except ImportError:  # not everywhere; plain lines instead
    tqdm = None

INDEX = "model.safetensors.index.json"
VOCAB = 32000


def say(*parts):
    print(*parts, flush=True)


def progress(items, desc):
    items = list(items)
    if tqdm is not None:
        return tqdm(items, desc=desc, unit="step", leave=False)
    say(f"{desc}: {len(items)} steps")
    return items


def llama_tensors(size):
    """(name, shape) of a Llama-like model whose bf16 weights fill about `size` bytes: the widest
    hidden size (4096 down to 128) that leaves room for a few layers, then as many layers as fit."""
    for hidden in (4096, 2048, 1024, 512, 256, 128):
        inter = (hidden * 8 // 3 + 15) // 16 * 16
        layer = 2 * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden)
        edges = 2 * (2 * VOCAB * hidden + hidden)
        if edges + 4 * layer <= size:
            break
    layers = max(1, (size - edges) // layer)
    names = [("model.embed_tokens.weight", (VOCAB, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        names += [(p + f"self_attn.{x}_proj.weight", (hidden, hidden)) for x in "qkvo"]
        names += [(p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
                  (p + "mlp.down_proj.weight", (hidden, inter)),
                  (p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
    names += [("model.norm.weight", (hidden,)), ("lm_head.weight", (VOCAB, hidden))]
    return names


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def generate(directory, size, shards):
    """Writes the checkpoint unless its index (written last) is there already."""
    index_path = os.path.join(directory, INDEX)
    wanted = {"teraio_bench_size": str(size), "teraio_bench_shards": str(shards)}
    if os.path.exists(index_path):
        with open(index_path) as f:
            have = json.load(f).get("metadata", {})
        if any(str(have.get(k)) != v for k, v in wanted.items()):
            sys.exit(f"{directory} holds a checkpoint of another size or shard count ({have}); "
                     "use another --dir (this benchmark never deletes checkpoints)")
        say(f"checkpoint: reusing {directory}")
        return
    os.makedirs(directory, exist_ok=True)
    tensors = llama_tensors(size)
    total = sum(2 * numel(shape) for _, shape in tensors)
    per_shard = -(-total // shards)
    groups, current, filled = [], [], 0
    for name, shape in tensors:
        if current and filled + 2 * numel(shape) > per_shard and len(groups) < shards - 1:
            groups.append(current)
            current, filled = [], 0
        current.append((name, shape))
        filled += 2 * numel(shape)
    groups.append(current)
    say(f"checkpoint: writing {teraio.format_bytes(total)} of bf16 in {len(groups)} shards to {directory}")
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    steps = [(i, name, shape) for i, group in enumerate(groups) for name, shape in group]
    data, shard = {}, 0
    for i, name, shape in progress(steps, "generate"):
        if i != shard:
            _write_shard(directory, shard, len(groups), data, weight_map)
            data, shard = {}, i
        data[name] = torch.randn(shape, generator=generator).to(torch.bfloat16)
    _write_shard(directory, shard, len(groups), data, weight_map)
    with open(index_path + ".tmp", "w") as f:
        json.dump({"metadata": {"total_size": total, **wanted}, "weight_map": weight_map}, f, indent=1)
    os.replace(index_path + ".tmp", index_path)


def _write_shard(directory, i, n, data, weight_map):
    name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    st.save_file(data, os.path.join(directory, name), metadata={"format": "pt"})
    weight_map.update({tensor: name for tensor in data})


class PageCache:
    """Empties the page cache before cold measurements: drop_caches as root, else (approximate)
    posix_fadvise(DONTNEED) on the checkpoint's files, and says which."""

    def __init__(self, files):
        self.files = files
        self.method = "drop_caches"
        try:
            self.drop()
        except OSError as e:
            self.method = "fadvise"
            say(f"cannot drop the page cache ({e}): cold figures are INVALID (files evicted with "
                "posix_fadvise(DONTNEED) only; run as root for valid ones)")

    @property
    def valid(self):
        return self.method == "drop_caches"

    def drop(self):
        os.sync()
        if self.method == "drop_caches":
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return
        for path in self.files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def warm(self):
        for path in self.files:
            with open(path, "rb", buffering=0) as f:
                while f.read(64 << 20):
                    pass


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()


def time_teraio(directory, device, io_mode, tuning):
    release(device)
    started = time.perf_counter()
    tensors = st.load(directory, device=device, io_mode=io_mode, **tuning)
    synchronize(device)
    seconds = time.perf_counter() - started
    stats = st.last_stats()
    return seconds, tensors, {"mode": stats.mode, "backend": stats.backend, "reason": stats.reason,
                              "bytes": stats.bytes, "gbps": stats.gigabytes_per_second, "io_seconds": stats.io_seconds}


def time_safetensors(files, device):
    from safetensors.torch import load_file
    release(device)
    started = time.perf_counter()
    tensors = {}
    for path in files:
        tensors.update(load_file(path, device=str(device)))
    synchronize(device)
    return time.perf_counter() - started, tensors


def time_dd(files, parallel):
    command = lambda path: ["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct", "status=none"]
    started = time.perf_counter()
    if parallel:
        runs = [subprocess.Popen(command(p), stderr=subprocess.PIPE) for p in files]
        errors = [r.communicate()[1] for r in runs]
        codes = [r.returncode for r in runs]
    else:
        done = [subprocess.run(command(p), stderr=subprocess.PIPE) for p in files]
        errors, codes = [d.stderr for d in done], [d.returncode for d in done]
    seconds = time.perf_counter() - started
    if any(codes):
        raise RuntimeError(f"dd failed: {b' '.join(errors).decode(errors='replace').strip()}")
    return seconds


def verify_against(reference, tensors):
    """Names where TeraIO's tensors differ from the reference's (dtype, shape or any value)."""
    if sorted(reference) != sorted(tensors):
        return sorted(set(reference) ^ set(tensors))
    return [n for n in reference if reference[n].dtype != tensors[n].dtype or not torch.equal(reference[n], tensors[n])]


def verify_independently(files, tensors):
    """Compares TeraIO's tensors with the bytes of the files, read by numpy (no TeraIO code)."""
    bad, seen = [], set()
    for path in files:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if os.path.getsize(path) > 8 + n else None
        for name, info in header.items():
            begin, end = info["data_offsets"]
            seen.add(name)
            expected = torch.from_numpy(np.array(data[begin:end])) if end > begin else torch.empty(0, dtype=torch.uint8)
            actual = tensors[name].cpu().reshape(-1).view(torch.uint8) if name in tensors else None
            if actual is None or list(tensors[name].shape) != info["shape"] or not torch.equal(actual, expected):
                bad.append(name)
    return bad + sorted(set(tensors) - seen)


def median_figures(runs, nbytes):
    out = {}
    for key, seconds in runs.items():
        if seconds:
            m = statistics.median(seconds)
            out[key] = {"seconds": m, "gbps": nbytes / m / 1e9, "runs": seconds}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.environ.get("TERAIO_BENCH_DIR", os.path.join("build", "st-bench")))
    parser.add_argument("--size", default="16GiB", help="checkpoint size (default 16GiB)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--io-mode", default="auto", choices=["auto", "cufile", "direct", "buffered"],
                        help="TeraIO's io_mode for the cold runs (warm runs use auto)")
    parser.add_argument("--chunk-mib", type=int, help="TeraIO's read chunk in MiB (default: the loader's, 16)")
    parser.add_argument("--in-flight", type=int, help="TeraIO's chunks in flight (default: the loader's, 4)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--generate-only", action="store_true", help="write the checkpoint and stop")
    args = parser.parse_args()

    size = teraio.parse_bytes(args.size)
    generate(args.dir, size, args.shards)
    if args.generate_only:
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with open(os.path.join(args.dir, INDEX)) as f:
        shard_names = sorted(set(json.load(f)["weight_map"].values()))
    files = [os.path.join(args.dir, name) for name in shard_names]
    nbytes = sum(os.path.getsize(p) for p in files)
    try:
        import safetensors
        have_safetensors, safetensors_version = True, safetensors.__version__
    except ImportError:
        have_safetensors, safetensors_version = False, None
        say("safetensors is not installed: its figures and the value check against it are skipped")
    have_dd = shutil.which("dd") is not None
    if not have_dd:
        say("dd not found: raw disk figures skipped")
    cache = PageCache(files)
    tuning = {"chunk_bytes": args.chunk_mib << 20 if args.chunk_mib else None, "chunks_in_flight": args.in_flight}

    runs = {k: [] for k in ("teraio_cold", "safetensors_cold", "dd_parallel", "dd_sequential",
                            "teraio_warm", "safetensors_warm")}
    teraio_stats, notes = {}, []
    teraio_result = reference_result = None
    steps = [(r, what) for r in range(args.repeat)
             for what in ("teraio_cold", "safetensors_cold", "dd_parallel", "dd_sequential", "warm_up",
                          "teraio_warm", "safetensors_warm")]
    for r, what in progress(steps, "measure"):
        last = r == args.repeat - 1
        if what.endswith("_cold") or what.startswith("dd_"):
            cache.drop()
        if what.startswith("teraio"):
            io_mode = args.io_mode if what == "teraio_cold" else "auto"
            seconds, tensors, stats = time_teraio(args.dir, device, io_mode, tuning)
            runs[what].append(seconds)
            teraio_stats[what.split("_")[1]] = stats
            teraio_result = tensors if last and what == "teraio_warm" else None
            del tensors
        elif what.startswith("safetensors") and have_safetensors:
            seconds, tensors = time_safetensors(files, device)
            runs[what].append(seconds)
            if last and what == "safetensors_warm":  # compared below with TeraIO's last warm load
                reference_result = tensors
            del tensors
        elif what.startswith("dd_") and have_dd:
            try:
                runs[what].append(time_dd(files, parallel=what == "dd_parallel"))
            except RuntimeError as e:
                notes.append(str(e))
                have_dd = False
                say(f"{e}: raw disk figures skipped")
        elif what == "warm_up":
            cache.warm()
    if teraio_result is not None and reference_result is not None:
        bad = verify_against(reference_result, teraio_result)
        verified = "safetensors library"
    else:
        bad = verify_independently(files, teraio_result)
        verified = "independent reading of the files"
    del teraio_result, reference_result
    release(device)

    median = median_figures(runs, nbytes)
    gbps = lambda key: median.get(key, {}).get("gbps")
    dd_best = max((g for g in (gbps("dd_parallel"), gbps("dd_sequential")) if g), default=None)
    ratios = {}
    if gbps("teraio_cold") and dd_best:
        ratios["cold_teraio_over_dd"] = {"value": gbps("teraio_cold") / dd_best, "target": 0.9,
                                         "valid": cache.valid}
    if gbps("teraio_warm") and gbps("safetensors_warm"):
        ratios["warm_teraio_over_safetensors"] = {"value": gbps("teraio_warm") / gbps("safetensors_warm"),
                                                  "target": 5.0}
    for ratio in ratios.values():
        ratio["met"] = ratio["value"] >= ratio["target"]
    result = {
        "checkpoint": {"dir": os.path.abspath(args.dir), "bytes": nbytes, "shards": len(files)},
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "torch": torch.__version__, "teraio_build": dict(teraio.build), "safetensors": safetensors_version,
        "repeat": args.repeat, "io_mode_cold": args.io_mode, "tuning": tuning,
        "cold_valid": cache.valid, "cold_method": cache.method,
        "median": median, "teraio_stats": teraio_stats, "ratios": ratios,
        "verified": {"against": verified, "mismatches": bad[:20], "ok": not bad}, "notes": notes,
    }

    say(f"\ncheckpoint {result['checkpoint']['dir']}: {teraio.format_bytes(nbytes)} in {len(files)} shards; "
        f"device {result['device']}; median of {args.repeat}")
    say(f"cold figures: {'valid (drop_caches)' if cache.valid else 'INVALID (page cache not dropped as root)'}")
    say(f"{'measurement':<20}{'seconds':>10}{'GB/s':>10}")
    for key in runs:
        if key in median:
            say(f"{key:<20}{median[key]['seconds']:>10.3f}{median[key]['gbps']:>10.2f}")
        else:
            say(f"{key:<20}{'skipped':>10}")
    for phase, stats in teraio_stats.items():
        say(f"teraio {phase}: {stats['mode']}/{stats['backend']}, {stats['io_seconds']:.3f} s in reads "
            f"({stats['reason']})")
    for name, ratio in ratios.items():
        flag = "met" if ratio["met"] else "NOT met"
        extra = "" if ratio.get("valid", True) else " (cold figures invalid)"
        say(f"{name}: {ratio['value']:.2f} (target >= {ratio['target']}: {flag}){extra}")
    say(f"values: {'identical' if not bad else 'DIFFER: ' + ', '.join(bad[:5])} (checked against the {verified})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        say(f"results: {args.json}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
