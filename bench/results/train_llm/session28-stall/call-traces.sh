#!/usr/bin/env bash
# Session 28, call 3: W3 profiles of 7-9 recomputed layers under today's recipes, for bench/bounds.py.
set -uo pipefail
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/traces28
. scripts/gpu/native-module.sh; ensure_native_module "$out"
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 545 python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 7,8,9 --recompute-measure 1 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --stall-rounds 12 --save-trace --child-timeout 540 \
  --out "$runs" 2>&1 | tee "$out/w3-traces.log"
python3 -c 'import lzma, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*-c*-trace.tiotrace")):
    (pathlib.Path(sys.argv[2]) / (f.name + ".xz")).write_bytes(lzma.compress(f.read_bytes(), preset=6))' "$runs" "$out"
cp "$runs"/W3-79GiB.md "$runs"/W3-79GiB.json "$out/" 2>/dev/null; ls -la "$out"
