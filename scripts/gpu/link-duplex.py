"""How fast the GPU's PCIe link moves pinned host memory one way and both ways at once, with the
host side walking a small or a large pinned region, with and without a compute load: what the
planner's link rates should be. Run on the GPU machine (about a minute):
    python3 scripts/gpu/link-duplex.py [REGION_GiB]
"""
import sys
import time

import torch

GiB, MiB = 1 << 30, 1 << 20
TOTAL = 16 * GiB  # per direction per case
DEV = 4 * GiB


def run(region, chunk, directions, load=False):
    d2h, h2d = torch.cuda.Stream(), torch.cuda.Stream()
    compute = torch.cuda.Stream()
    streams = {"d2h": d2h, "h2d": h2d}
    starts = {k: torch.cuda.Event(enable_timing=True) for k in streams}
    ends = {k: torch.cuda.Event(enable_timing=True) for k in streams}
    torch.cuda.synchronize()
    if load:
        with torch.cuda.stream(compute):
            for _ in range(60):
                a @ b
    for k in directions:
        starts[k].record(streams[k])
    n = TOTAL // chunk
    for i in range(n):
        h = (i * chunk) % region
        d = (i * chunk) % DEV
        if "d2h" in directions:
            with torch.cuda.stream(d2h):
                host_out[h:h + chunk].copy_(dev_a[d:d + chunk], non_blocking=True)
        if "h2d" in directions:
            with torch.cuda.stream(h2d):
                dev_b[d:d + chunk].copy_(host_in[h:h + chunk], non_blocking=True)
    for k in directions:
        ends[k].record(streams[k])
    torch.cuda.synchronize()
    rates = {k: TOTAL / (starts[k].elapsed_time(ends[k]) / 1e3) / 1e9 for k in directions}
    span = max(starts[k].elapsed_time(ends[k]) for k in directions) / 1e3
    return rates, len(directions) * TOTAL / span / 1e9


big = int(float(sys.argv[1]) * GiB) if len(sys.argv) > 1 else 32 * GiB
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
t = time.time()
host_out = torch.empty(big, dtype=torch.uint8, pin_memory=True)
host_in = torch.empty(big, dtype=torch.uint8, pin_memory=True)
host_in[::4096] = 1
host_out[::4096] = 1
print(f"pinned 2 x {big / GiB:.0f} GiB in {time.time() - t:.1f} s", flush=True)
dev_a = torch.ones(DEV, dtype=torch.uint8, device="cuda")
dev_b = torch.empty(DEV, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda")
b = torch.randn(8192, 8192, device="cuda")
run(GiB, 64 * MiB, ("d2h", "h2d"))  # warm-up
for region in (GiB, big):
    for chunk in (64 * MiB, 8 * MiB):
        for directions in (("d2h",), ("h2d",), ("d2h", "h2d")):
            for load in ((False, True) if len(directions) == 2 else (False,)):
                rates, total = run(region, chunk, directions, load)
                each = ", ".join(f"{k} {r:.1f}" for k, r in rates.items())
                print(f"region {region / GiB:4.0f} GiB chunk {chunk // MiB:3d} MiB {'+'.join(directions):8s}"
                      f"{' +matmul' if load else '        '}: {each} GB/s; together {total:.1f} GB/s", flush=True)
