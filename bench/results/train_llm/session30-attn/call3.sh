#!/usr/bin/env bash
# Session 30, call 3: W3 with 1 of 32 layers recomputed (default stall search), one warm-up and
# one measured step, then one step under torch.profiler (--gpu-profile): where the 6 s between
# the plan (20.8 s) and the measured step (26.7 s, call 2) go.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s30c3
. scripts/gpu/native-module.sh; ensure_native_module "$out"
echo "build done ($((SECONDS - start)) s)"
left=$((590 - (SECONDS - start)))
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --gpu-profile --child-timeout "$((left - 5))" \
  --out "$runs" >"$out/w3-c1-profile.log" 2>&1
echo "status $? ($((SECONDS - start)) s)"; grep -v "^  \[W3 teraio-recompute\] step" "$out/w3-c1-profile.log" | tail -n 40 | cut -c1-900
cp "$runs"/W3-79GiB.md "$runs"/W3-79GiB.json "$out/" 2>/dev/null; echo "total $((SECONDS - start)) s"
