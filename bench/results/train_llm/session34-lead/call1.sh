#!/usr/bin/env bash
# Session 34, call 1: the machine's NUMA layout and the host tier's NUMA line (first GPU run of
# io/numa), then W2 @ 16 GiB with 8 of 8 recomputed, three plans on one machine, in order:
# default (lead 3), --early-prefetch-lead 100, --early-prefetch-lead 100 --plan-pcie 46GB/s.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s34c1
lscpu | grep -iE "numa|socket|model name"; nvidia-smi topo -m; nvidia-smi --query-gpu=pci.bus_id --format=csv
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
for arm in ${ARMS:-default lead100 lead100at46}; do
  extra=()
  [ $arm = lead100 ] && extra=(--early-prefetch-lead 100)
  [ $arm = lead100at46 ] && extra=(--early-prefetch-lead 100 --plan-pcie 46GB/s)
  left=$((560 - (SECONDS - start))); [ "$left" -lt 100 ] && { echo "no time for $arm"; break; }
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W2 --budget 16GiB \
    --modes teraio-recompute --recompute-counts 8 --recompute-measure 0 --warmup 1 --steps 3 --host-budget 48GiB \
    --allocator paged "${extra[@]}" --child-timeout "$((left - 5))" --out "$runs/$arm" >"$out/w2-$arm.log" 2>&1
  echo "W2 $arm: status $? ($((SECONDS - start)) s)"; grep -E "^\| teraio" "$runs/$arm/W2-16GiB.md"
  grep -E "step .*measured" "$out/w2-$arm.log" | sed -E 's/ callbacks.*link:/ link:/' | cut -c1-330
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); [print(m.get("teraio",{}).get("backends","")) for m in r["modes"].values()]' "$runs/$arm/W2-16GiB.json" 2>&1 | head -8
  cp "$runs/$arm/W2-16GiB.md" "$out/w2-$arm.md"; cp "$runs/$arm/W2-16GiB.json" "$out/w2-$arm.json"; xz -T0 "$out/w2-$arm.log"
done
echo "total $((SECONDS - start)) s"
