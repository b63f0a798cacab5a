#!/usr/bin/env bash
# Session 31, call 8: W2 @ 16 GiB with 8 of 8 recomputed, planned three ways on one machine:
# default, --pcie-duplex 88GB/s, --plan-latency 200us (3 measured steps each).
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s31c8
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
for arm in default duplex88 latency200; do
  extra=()
  [ $arm = duplex88 ] && extra=(--pcie-duplex 88GB/s)
  [ $arm = latency200 ] && extra=(--plan-latency 200us)
  left=$((470 - (SECONDS - start))); [ "$left" -lt 60 ] && { echo "no time for $arm"; break; }
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W2 --budget 16GiB \
    --modes teraio-recompute --recompute-counts 8 --recompute-measure 0 --warmup 1 --steps 3 --host-budget 48GiB \
    --allocator paged "${extra[@]}" --child-timeout "$((left - 5))" --out "$runs/$arm" >"$out/w2-$arm.log" 2>&1
  echo "W2 $arm: status $? ($((SECONDS - start)) s)"; grep -E "^\| teraio" "$runs/$arm/W2-16GiB.md"
  grep -E "step .*measured" "$out/w2-$arm.log" | cut -c1-160
  cp "$runs/$arm/W2-16GiB.md" "$out/w2-$arm.md" 2>/dev/null
done
echo "total $((SECONDS - start)) s"
