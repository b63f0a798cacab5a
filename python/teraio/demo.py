"""`python -m teraio demo`: trains a small GPT under a memory budget of a fraction of its
footprint and checks that every loss and every final parameter is bit-identical to the same
training without TeraIO.

Three runs of the same model from the same seed on the same batches:
  1. the reference, plain PyTorch;
  2. a short throwaway session without a budget, to measure the footprint;
  3. the run under TeraIO with gpu_budget = fraction * footprint, offloading to --ssd.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Callable

import torch

from .models import gpt

try:
    from tqdm import tqdm
except ImportError:  # the demo prints one line per step instead
    tqdm = None

WARMUP_STEPS = 1
PROFILE_STEPS = 2


@dataclasses.dataclass
class RunResult:
    losses: list[torch.Tensor]       # one float tensor per step, on the CPU
    params: dict[str, torch.Tensor]  # final parameters, on the CPU
    step_times: list[float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--budget-fraction", type=float, default=0.4,
                        help="GPU budget as a fraction of the measured footprint (default 0.4)")
    parser.add_argument("--ssd", metavar="DIR", help="directory for swap files (default OUT/swap)")
    parser.add_argument("--ssd-capacity", default=None, metavar="SIZE",
                        help="swap space, preallocated (default: twice the footprint, at least 64MiB)")
    parser.add_argument("--host-budget", default=None, metavar="SIZE",
                        help="pinned host tier, e.g. 2GiB (default: 0 on cpu, where it is pointless; 4GiB on cuda)")
    parser.add_argument("--size", choices=gpt.preset_names(), default=None,
                        help="model preset (default: small on cpu, large on cuda)")
    parser.add_argument("--out", default="build/demo", metavar="DIR",
                        help="where the trace, plan, timeline and report go (default build/demo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.steps <= WARMUP_STEPS + PROFILE_STEPS:
        parser.error(f"--steps must exceed the {WARMUP_STEPS + PROFILE_STEPS} warm-up and profile steps")
    if not 0 < args.budget_fraction:
        parser.error("--budget-fraction must be positive")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device {args.device}: only cpu and cuda are supported")


def _make_deterministic(device: torch.device) -> None:
    if device.type == "cuda":
        # cuBLAS picks reduction orders by workspace; a fixed workspace makes them repeatable.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)


def _train(config: gpt.GPTConfig, args: argparse.Namespace, batches: list, steps: int,
           session=None, on_step: Callable[[int, torch.Tensor, float], None] | None = None) -> RunResult:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = gpt.GPT(config).to(device)
    # foreach=False: a foreach step touches every parameter in one operator, which would have
    # to fit the budget whole; per-parameter updates let the optimizer states stream.
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    losses, times = [], []
    for step in range(steps):
        tokens, targets = batches[step]
        started = time.perf_counter()
        if session is None:
            loss = _step(model, optimizer, tokens, targets, device)
        else:
            with session.step():
                loss = _step(model, optimizer, tokens, targets, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
        losses.append(loss)
        if on_step is not None:
            on_step(step, loss, times[-1])
    # Copying is an operator: an offloaded parameter is fetched on demand, one at a time, so
    # this works even where session.resident() could not hold everything at once.
    return RunResult(losses, _cpu_params(model), times)


def _step(model, optimizer, tokens, targets, device) -> torch.Tensor:
    loss = model(tokens.to(device), targets.to(device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().to("cpu", copy=True)


def _cpu_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}


def _measure_footprint(teraio, config, args, batches) -> int:
    session = teraio.Session(gpu_budget=None, host_budget=0, ssd=[], device=args.device,
                             warmup_steps=WARMUP_STEPS, profile_steps=PROFILE_STEPS)
    try:
        _train(config, args, batches, WARMUP_STEPS + PROFILE_STEPS, session=session)
        return int(session.report().to_dict()["footprint_bytes"])
    finally:
        session.close()


def _first_mismatch(reference: RunResult, result: RunResult) -> str | None:
    for step, (want, got) in enumerate(zip(reference.losses, result.losses)):
        if not torch.equal(want, got):
            return (f"loss of step {step}: {got.item()!r} ({got.item().hex()}) with TeraIO, "
                    f"{want.item()!r} ({want.item().hex()}) without")
    if reference.params.keys() != result.params.keys():
        return f"parameter names differ: {sorted(reference.params.keys() ^ result.params.keys())}"
    for name, want in reference.params.items():
        got = result.params[name]
        if not torch.equal(want, got):
            differ = (want != got).nonzero()
            index = tuple(differ[0].tolist())
            return (f"parameter {name}: {differ.shape[0]} of {want.numel()} elements differ, first at {index}: "
                    f"{got[index].item()!r} with TeraIO, {want[index].item()!r} without")
    return None


class _Progress:
    """A tqdm bar with one line per step above it, or plain lines without tqdm."""

    def __init__(self, steps: int, session, teraio) -> None:
        self._session = session
        self._format = teraio.format_bytes
        self._bar = (tqdm(total=steps, unit="step", dynamic_ncols=True, disable=not sys.stderr.isatty())
                     if tqdm is not None else None)

    def __call__(self, step: int, loss: torch.Tensor, seconds: float) -> None:
        last = self._session.last_step
        moved = last["bytes_offloaded"] + last["bytes_prefetched"]
        line = (f"step {step:3d}  loss {loss.item():.4f}  time {seconds * 1e3:7.1f} ms  "
                f"stall {last['stall_s'] * 1e3:6.1f} ms  moved {self._format(moved):>10}  "
                f"{last['phase']}/{last['mode']}")
        if last.get("demand_fetches"):
            line += f"  demand fetches {last['demand_fetches']}"
        if self._bar is None:
            print(line, flush=True)
            return
        self._bar.write(line)
        self._bar.set_postfix_str(f"loss {loss.item():.4f} {last['phase']}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run(args: argparse.Namespace) -> int:
    import teraio

    device = torch.device(args.device)
    _make_deterministic(device)
    config = gpt.preset(args.size or ("large" if device.type == "cuda" else "small"))
    host_budget = args.host_budget if args.host_budget is not None else ("4GiB" if device.type == "cuda" else 0)
    out = pathlib.Path(args.out)
    ssd = pathlib.Path(args.ssd) if args.ssd else out / "swap"
    ssd.mkdir(parents=True, exist_ok=True)

    generator = torch.Generator().manual_seed(args.seed + 1)
    batches = [gpt.make_batch(generator, config.batch, config.seq, config.vocab) for _ in range(args.steps)]
    n_params = sum(p.numel() for p in gpt.GPT(config).parameters())
    print(f"teraio demo: GPT {config.layers} layers, d_model {config.d_model}, {n_params / 1e6:.1f}M parameters, "
          f"batch {config.batch}x{config.seq} tokens, AdamW, {args.steps} steps on {device}")

    print(f"\n[1/3] reference run without TeraIO ({args.steps} steps)")
    reference = _train(config, args, batches, args.steps)
    print(f"      mean step {_mean_ms(reference.step_times[1:]):.1f} ms, final loss {reference.losses[-1].item():.4f}")

    print(f"\n[2/3] footprint: {WARMUP_STEPS + PROFILE_STEPS} steps under a session without a budget")
    footprint = _measure_footprint(teraio, config, args, batches)
    budget = int(args.budget_fraction * footprint)
    print(f"      footprint {teraio.format_bytes(footprint)}; budget {args.budget_fraction:g} x footprint = "
          f"{teraio.format_bytes(budget)}")

    # The swap file is preallocated: size it to the model rather than to a fixed figure.
    capacity = args.ssd_capacity if args.ssd_capacity is not None else max(2 * footprint, 64 << 20)
    print(f"\n[3/3] training under TeraIO: gpu_budget {teraio.format_bytes(budget)}, host_budget {host_budget}, "
          f"ssd {ssd} ({teraio.format_bytes(teraio.parse_bytes(capacity))})")
    swap_files_before = set(ssd.iterdir())
    session = teraio.Session(gpu_budget=budget, host_budget=host_budget, ssd=[str(ssd)],
                             ssd_capacity=capacity, device=args.device,
                             warmup_steps=WARMUP_STEPS, profile_steps=PROFILE_STEPS)
    try:
        progress = _Progress(args.steps, session, teraio)
        try:
            result = _train(config, args, batches, args.steps, session=session, on_step=progress)
        finally:
            progress.close()
        report = session.report()
        print()
        print(report)
        written = _write_outputs(session, report, out)
    finally:
        session.close()
        for swap_file in set(ssd.iterdir()) - swap_files_before:
            swap_file.unlink()

    planned = [t for t, s in zip(result.step_times, report.to_dict()["steps"]) if s["phase"] == "planned"]
    print(f"\nmean step: {_mean_ms(reference.step_times[1:]):.1f} ms without TeraIO, "
          f"{_mean_ms(planned):.1f} ms planned under TeraIO")
    print("written:")
    for what, path in written:
        print(f"  {what:9} {path}")

    mismatch = _first_mismatch(reference, result)
    if mismatch is not None:
        print(f"\nFAIL: not bit-identical to the run without TeraIO: {mismatch}")
        return 1
    print(f"\nPASS: {args.steps} losses and {len(result.params)} parameter tensors bit-identical to the run "
          f"without TeraIO")
    return 0


def _mean_ms(seconds: list[float]) -> float:
    return 1e3 * sum(seconds) / len(seconds) if seconds else float("nan")


def _write_outputs(session, report, out: pathlib.Path) -> list[tuple[str, pathlib.Path]]:
    out.mkdir(parents=True, exist_ok=True)
    written = [("trace", out / "trace.json"), ("plan", out / "plan.json"), ("timeline", out / "timeline.json"),
               ("report", out / "report.json")]
    session.save_trace(str(written[0][1]))
    session.save_plan(str(written[1][1]))
    session.export_timeline(str(written[2][1]))
    written[3][1].write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    return [(what, path.resolve()) for what, path in written]


def main(argv: list[str] | None = None, prog: str = "teraio demo") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    import teraio

    try:
        return run(args)
    except teraio.Error as e:
        print(f"\n{prog}: {e}", file=sys.stderr)
        if getattr(e, "kind", None) == "infeasible":
            print(f"{prog}: try a larger --budget-fraction", file=sys.stderr)
        return 1
