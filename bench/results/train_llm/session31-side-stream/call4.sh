#!/usr/bin/env bash
# Session 31, call 4 (warm machine, both modules built there): W3 16 of 32, side stream then main.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s31; root=$PWD
for arm in side main; do
  dir=.; [ $arm = side ] && dir=build-wt/side
  left=$(( (590 - (SECONDS - start)) ))
  [ $arm = side ] && left=$((left / 2 + 20))
  (cd "$dir" && PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
    --modes teraio-recompute --recompute-counts 16 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
    --host-budget 100GiB --allocator paged --paged-page 16MiB --child-timeout "$((left - 5))" \
    --out "$runs/$arm-c16-b" >"$out/w3-c16-$arm-b.log" 2>&1)
  echo "W3 $arm: status $? ($((SECONDS - start)) s)"; grep -E "PCIe link" "$out/w3-c16-$arm-b.log"
  grep -E "^\| teraio" "$runs/$arm-c16-b/W3-79GiB.md"
done
echo "total $((SECONDS - start)) s"
