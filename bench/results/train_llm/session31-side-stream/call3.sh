#!/usr/bin/env bash
# Session 31, call 3 (warm machine, build-wt/side's module built there): W3 1 of 32 on the
# side-stream branch with the default (full) stall search, 1 warm-up, 1 measured step.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s31
cd build-wt/side && ls python/teraio/_native*.so || exit 1
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 570 python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --child-timeout 565 \
  --out "$runs/side-c1" >"$out/w3-c1-side.log" 2>&1
echo "W3 side c1: status $? ($((SECONDS - start)) s)"; grep -E "planned with|step .*(measured|warm-up)" "$out/w3-c1-side.log" | cut -c1-400
grep -E "PCIe link" "$out/w3-c1-side.log"; grep -E "^\| teraio" "$runs"/side-c1/W3-79GiB.md
cp "$runs"/side-c1/W3-79GiB.md "$out/side-c1-W3-79GiB.md" 2>/dev/null; cp "$runs"/side-c1/W3-79GiB.json "$out/side-c1-W3-79GiB.json" 2>/dev/null
echo "total $((SECONDS - start)) s"
