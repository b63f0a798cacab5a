#!/usr/bin/env python3
"""TeraIO on a transformers LlamaForCausalLM (random weights, built from a config): exactness
under a GPU budget of about half the footprint, and overhead when the model fits.

Runs, in one process on one GPU:
  1. the reference: N AdamW steps without TeraIO (twice, to show the run itself is deterministic);
  2. a throwaway session without a budget, to measure the footprint (peak tracked memory);
  3. the same N steps under teraio.Session(gpu_budget=fraction x footprint), with the caching
     allocator capped by torch.cuda.set_per_process_memory_fraction, compared bit for bit;
  4. overhead when the model fits: plain PyTorch against a session with no budget, median step.
Writes a JSON summary with --json. Example:
  python3 bench/train_llama.py --ssd /tmp/teraio-swap --json out/llama.json
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import teraio  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--overhead-steps", type=int, default=20)
    p.add_argument("--budget-fraction", type=float, default=0.5)
    p.add_argument("--host-budget", default="8GiB")
    p.add_argument("--ssd", default=None, help="swap directory (default: a temporary one)")
    p.add_argument("--ssd-capacity", default="16GiB")
    p.add_argument("--json", default=None)
    return p.parse_args()


def build(args, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        intermediate_size=args.ffn,
        vocab_size=args.vocab,
        max_position_embeddings=args.seq,
    )
    # Eager attention: SDPA's flash backward accumulates with atomics and is not bit-reproducible.
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(device)
    # foreach=False: a foreach step updates every parameter in one operator, whose working set
    # (all model states) could not fit a budget below the model states.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    return model, optimizer


def batches(args, device, steps):
    g = torch.Generator(device="cpu").manual_seed(1)
    return [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device) for _ in range(steps)]


def train(args, device, steps, session=None, label=""):
    model, optimizer = build(args, device)
    data = batches(args, device, steps)
    losses, times = [], []
    for i, ids in enumerate(data):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ctx = session.step() if session is not None else _null()
        with ctx:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach().clone())
        extra = ""
        if session is not None and session.last_step:
            s = session.last_step
            extra = (f" phase {s['phase']} stall {s['stall_s']:.3f}s out {teraio.format_bytes(s['bytes_offloaded'])}"
                     f" in {teraio.format_bytes(s['bytes_prefetched'])} demand {s['demand_fetches']}"
                     f" peak {teraio.format_bytes(s['peak_resident'])}")
        print(f"  {label} step {i}: loss {loss.item():.6f} time {times[-1]:.3f}s{extra}", flush=True)
    # Kept on the CPU so that the reference does not count against the later memory cap.
    params = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return [x.cpu() for x in losses], params, times


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def same(a, b):
    la, pa = a[0], a[1]
    lb, pb = b[0], b[1]
    for i, (x, y) in enumerate(zip(la, lb)):
        if not torch.equal(x, y):
            return f"loss of step {i} differs: {x.item()!r} vs {y.item()!r}"
    for name in pa:
        if not torch.equal(pa[name], pb[name]):
            return f"parameter {name} differs"
    return None


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_llama.py needs a CUDA GPU")
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda", 0)
    swap = args.ssd or tempfile.mkdtemp(prefix="teraio-llama-")
    os.makedirs(swap, exist_ok=True)
    result = {"args": vars(args), "device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    print("reference (twice)", flush=True)
    ref = train(args, device, args.steps, label="ref")
    ref2 = train(args, device, args.steps, label="ref2")
    result["reference_deterministic"] = same(ref, ref2) is None

    print("footprint", flush=True)
    with teraio.Session(device=device) as probe:
        train(args, device, 3, session=probe, label="footprint")
        footprint = probe.report()["footprint_bytes"]
    torch.cuda.empty_cache()
    budget = int(footprint * args.budget_fraction)
    total = torch.cuda.get_device_properties(0).total_memory
    # The cap is the budget plus what the session does not track (small tensors, allocator
    # rounding, cuBLAS workspaces): measured beside it, not hidden.
    cap_bytes = budget + (1 << 30)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), 0)
    torch.cuda.reset_peak_memory_stats(0)
    print(f"TeraIO under a budget of {teraio.format_bytes(budget)} (footprint {teraio.format_bytes(footprint)},"
          f" allocator cap {teraio.format_bytes(cap_bytes)})", flush=True)
    session = teraio.Session(gpu_budget=budget, host_budget=args.host_budget, ssd=[swap], ssd_capacity=args.ssd_capacity,
                             device=device)
    out = train(args, device, args.steps, session=session, label="teraio")
    report = session.report()
    print(report)
    allocator_peak = torch.cuda.max_memory_allocated(0)
    session.save_trace(os.path.join(swap, "llama-trace.json"))
    session.close()
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    mismatch = same(ref, out)
    result.update(
        footprint_bytes=footprint,
        gpu_budget=budget,
        allocator_cap_bytes=cap_bytes,
        allocator_peak_bytes=allocator_peak,
        exact=mismatch is None,
        mismatch=mismatch,
        steps=report["steps"],
        plan=report["plan"],
        peak_resident_max=max(s["peak_resident"] for s in report["steps"]),
    )
    print(f"exact against the reference: {'PASS' if mismatch is None else 'FAIL: ' + mismatch}", flush=True)

    print("overhead when the model fits", flush=True)
    torch.cuda.empty_cache()
    _, _, plain_times = train(args, device, args.overhead_steps, label="plain")
    with teraio.Session(device=device) as fits:
        _, _, fit_times = train(args, device, args.overhead_steps, session=fits, label="fits")
        phases = [s["phase"] for s in fits.report()["steps"]]
    skip = 4  # warm-up, profile steps and the first passive one
    plain = statistics.median(plain_times[skip:])
    fit = statistics.median(fit_times[skip:])
    result.update(plain_step_s=plain, teraio_fit_step_s=fit, overhead=fit / plain - 1, fit_phases=phases)
    print(f"median step: plain {plain:.4f}s, TeraIO (fits, {phases[-1]}) {fit:.4f}s, overhead {100 * (fit / plain - 1):+.2f}%")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    sys.exit(0 if mismatch is None else 1)


if __name__ == "__main__":
    main()
