#!/usr/bin/env bash
# Session 32, calls 2-4: W3 @ 79 GiB with 16 of 32 layers recomputed (session 28's best
# configuration), 3 measured steps, one arm per call on one machine:
#   ARM=default     the default plan margin (64 MiB) and position_for_plan()
#   ARM=margin0     --plan-margin 0 (plans for the whole budget, as before session 32)
#   ARM=latency200  the default margin and --plan-latency 200us
# (arms for the next session, not run in session 32:)
#   ARM=margin128   --plan-margin 128MiB
#   ARM=reltrack    --release-tracking on (the profile records when each storage is freed)
#   ARM=latency500  --plan-latency 500us
#   ARM=lead100     --early-prefetch-lead 100 (added in session 33)
#   ARM=lead100at46 --early-prefetch-lead 100 --plan-pcie 46GB/s (added in session 33)
# COUNT=N recomputes N of 32 layers instead of 16.
set -uo pipefail
start=$SECONDS
arm=${ARM:-default}
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s32-${COUNT:-16}-$arm
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
extra=()
[ "$arm" = margin0 ] && extra=(--plan-margin 0)
[ "$arm" = latency200 ] && extra=(--plan-latency 200us)
[ "$arm" = margin128 ] && extra=(--plan-margin 128MiB)
[ "$arm" = reltrack ] && extra=(--release-tracking on)
[ "$arm" = latency500 ] && extra=(--plan-latency 500us)
[ "$arm" = lead100 ] && extra=(--early-prefetch-lead 100)
[ "$arm" = lead100at46 ] && extra=(--early-prefetch-lead 100 --plan-pcie 46GB/s)
count=${COUNT:-16}
left=$((570 - (SECONDS - start)))
TERAIO_LOG_LEVEL=debug PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts "$count" --recompute-measure 0 --warmup 1 --steps 3 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB "${extra[@]}" --child-timeout "$((left - 5))" \
  --out "$runs" >"$out/w3-c$count-$arm.log" 2>&1
echo "W3 c$count $arm: status $? ($((SECONDS - start)) s)"; grep -E "PCIe link|kept free" "$out/w3-c$count-$arm.log"; grep -E "^\| teraio" "$runs/W3-79GiB.md"
grep -cE "debug.*evict tensor" "$out/w3-c$count-$arm.log"; grep -cE "debug.*demand fetch" "$out/w3-c$count-$arm.log"
grep -E "step .*measured" "$out/w3-c$count-$arm.log" | cut -c1-300
cp "$runs/W3-79GiB.md" "$out/w3-c$count-$arm.md"; cp "$runs/W3-79GiB.json" "$out/w3-c$count-$arm.json"
xz -T0 "$out/w3-c$count-$arm.log"
echo "total $((SECONDS - start)) s"
