#!/usr/bin/env bash
# Session 30, call 2 (default attention): W3 traces of 0 and 2 recomputed layers under today's
# profile (their bounds were on session 18's host-bound traces), then count 1 with the full stall
# search and 3 measured steps (it has only run a 2-round plan; its bound is 90.2%).
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s30c2
. scripts/gpu/native-module.sh; ensure_native_module "$out"
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 260 python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 0,2 --recompute-measure 0 --warmup 0 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --stall-rounds 2 --save-trace --child-timeout 255 \
  --out "$runs" >"$out/w3-traces.log" 2>&1
echo "traces status $? ($((SECONDS - start)) s)"; grep -E "trial|measured" "$out/w3-traces.log" | cut -c1-400
python3 -c 'import lzma, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*-c*-trace.tiotrace")):
    (pathlib.Path(sys.argv[2]) / (f.name + ".xz")).write_bytes(lzma.compress(f.read_bytes(), preset=6))' "$runs" "$out"
cp "$runs"/W3-79GiB.md "$out/W3-traces.md" 2>/dev/null; cp "$runs"/W3-79GiB.json "$out/W3-traces.json" 2>/dev/null
left=$((590 - (SECONDS - start)))
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1 --warmup 1 --steps 3 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --child-timeout "$((left - 5))" \
  --out "$out/c1" >"$out/w3-c1.log" 2>&1
echo "count 1 status $? ($((SECONDS - start)) s)"; tail -n 22 "$out/w3-c1.log" | cut -c1-600
ls -la "$out"; echo "total $((SECONDS - start)) s"
