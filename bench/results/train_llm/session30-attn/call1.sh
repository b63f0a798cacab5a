#!/usr/bin/env bash
# Session 30, call 1: which SDPA kernels take W3's and W2's attention; W3's ideal by layer
# extrapolation with transformers' default SDPA call and with --attn sdpa-repeat-kv (same
# machine); then, if the variant ran, its recompute profiles at 0 and 1 layers with traces.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s30c1
. scripts/gpu/native-module.sh; ensure_native_module "$out"
echo "build done ($((SECONDS - start)) s)"
timeout 120 bash scripts/gpu/sdpa-backends.sh >"$out/sdpa.log" 2>&1; echo "sdpa status $?"; cat "$out/sdpa.log"
for attn in sdpa-repeat-kv sdpa; do
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 150 python3 bench/train_llm.py --workload W3 --budget 79GiB --modes ideal \
    --extrapolate 2,4,3 --warmup 1 --steps 3 --attn "$attn" --child-timeout 140 \
    --out "$out/ideal-$attn" >"$out/ideal-$attn.log" 2>&1
  echo "ideal $attn status $? ($((SECONDS - start)) s)"; tail -n 25 "$out/ideal-$attn/W3-79GiB.md" 2>/dev/null
done
left=$((585 - (SECONDS - start)))
if [ -f "$out/ideal-sdpa-repeat-kv/W3-79GiB.json" ] && [ "$left" -gt 150 ]; then
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
    --modes teraio-recompute --recompute-counts 0,1 --recompute-measure 0 --warmup 0 --steps 1 --reserve 5GiB \
    --host-budget 100GiB --allocator paged --paged-page 16MiB --stall-rounds 2 --save-trace --attn sdpa-repeat-kv \
    --child-timeout "$((left - 5))" --out "$runs" >"$out/w3-rkv.log" 2>&1
  echo "w3 rkv status $? ($((SECONDS - start)) s)"; tail -n 30 "$out/w3-rkv.log"
  python3 -c 'import lzma, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*-c*-trace.tiotrace")):
    (pathlib.Path(sys.argv[2]) / (f.name + ".xz")).write_bytes(lzma.compress(f.read_bytes(), preset=6))' "$runs" "$out"
  cp "$runs"/W3-79GiB.md "$runs"/W3-79GiB.json "$out/" 2>/dev/null
fi
ls -la "$out"; echo "total $((SECONDS - start)) s"
