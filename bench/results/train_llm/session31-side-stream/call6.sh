#!/usr/bin/env bash
# Session 31, call 6: W3 1 of 32 (full search) with --release-tracking on and --save-trace,
# evictions and demand fetches logged (TERAIO_LOG_LEVEL=debug); device waits against the simulation.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s31c6
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
[ -x build/gpu/tools/teraio/teraio ] || ninja -C build/gpu teraio >/dev/null
left=$((560 - (SECONDS - start)))
TERAIO_LOG_LEVEL=debug PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --save-trace --release-tracking on --child-timeout "$((left - 5))" \
  --out "$runs" >"$out/w3-c1-rel.log" 2>&1
echo "W3 c1 release on: status $? ($((SECONDS - start)) s)"; grep -E "PCIe link" "$out/w3-c1-rel.log"; grep -E "^\| teraio" "$runs/W3-79GiB.md"
grep -cE "debug.*evict tensor" "$out/w3-c1-rel.log"; grep -E "step .*measured" "$out/w3-c1-rel.log" | cut -c1-300
stem=$runs/W3-79GiB-teraio-recompute
timeout 60 python3 bench/device_stalls.py "$stem-device-waits.json" --trace "$stem-trace.tiotrace" --plan "$stem-plan.json" \
  --teraio build/gpu/tools/teraio/teraio --json "$out/device-stalls.json" --worst 10 >"$out/device-stalls.txt" 2>&1
echo "device_stalls: status $?"; head -n 4 "$out/device-stalls.txt"; grep -E "^(backward 1[0-2]|optimizer|forward 1) " "$out/device-stalls.txt"
xz -T0 "$out/w3-c1-rel.log"
tar -C "$runs" -I "xz -T0" -cf "$out/c1-rel-saved.tar.xz" W3-79GiB.md W3-79GiB.json "$(basename "$stem")-device-waits.json" \
  "$(basename "$stem")-trace.tiotrace" "$(basename "$stem")-plan.json"
echo "total $((SECONDS - start)) s"
