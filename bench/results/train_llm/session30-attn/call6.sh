#!/usr/bin/env bash
# Session 30, call 6: W3 with 1 of 32 recomputed planned with the shared-link cap measured in
# call 5 under a compute load (--pcie-duplex 84GB/s), then 16 of 32 (the best count) with the
# default plan; one warm-up and one measured step each, link activity per step.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}
. scripts/gpu/native-module.sh; ensure_native_module "$out"
for spec in "1 84GB/s" "16 none"; do
  set -- $spec; count=$1; duplex=$2
  extra=(); [ "$duplex" != none ] && extra=(--pcie-duplex "$duplex")
  left=$((595 - (SECONDS - start))); [ "$count" = 1 ] && left=$((left < 300 ? left : 300))
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
    --modes teraio-recompute --recompute-counts "$count" --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
    --host-budget 100GiB --allocator paged --paged-page 16MiB "${extra[@]}" --child-timeout "$((left - 5))" \
    --out "$out/c$count" >"$out/w3-c$count.log" 2>&1
  echo "count $count duplex $duplex: status $? ($((SECONDS - start)) s)"
  grep -E "planned with|step .*measured" "$out/w3-c$count.log" | cut -c1-420; grep -o "link: .*" "$out/w3-c$count.log"
done
echo "total $((SECONDS - start)) s"
