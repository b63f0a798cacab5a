#!/usr/bin/env bash
# Session 31, call 5 (fresh machine): build, the CUDA device-waits test, then W3 1 of 32 (full
# search) with --save-trace; line the measured device waits up with the simulation there.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s31c5
. scripts/gpu/native-module.sh
TERAIO_REBUILD=1 ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
PYTHONPATH=$(pytest_pythonpath) timeout 120 python3 -m pytest -q -p no:cacheprovider tests/python/test_training_exact.py \
  -k "waits_handed" 2>&1 | tail -n 5
left=$((575 - (SECONDS - start)))
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --save-trace --child-timeout "$((left - 5))" \
  --out "$runs" >"$out/w3-c1.log" 2>&1
echo "W3 c1: status $? ($((SECONDS - start)) s)"; grep -E "PCIe link" "$out/w3-c1.log"; grep -E "^\| teraio" "$runs/W3-79GiB.md"
stem=$runs/W3-79GiB-teraio-recompute
timeout 60 python3 bench/device_stalls.py "$stem-device-waits.json" --trace "$stem-trace.tiotrace" --plan "$stem-plan.json" \
  --teraio build/gpu/tools/teraio/teraio --json "$out/device-stalls.json" --worst 25 >"$out/device-stalls.txt" 2>&1
echo "device_stalls: status $?"; head -c 6000 "$out/device-stalls.txt"
tar -C "$runs" -I "xz -T0" -cf "$out/c1-saved.tar.xz" W3-79GiB.md W3-79GiB.json "$(basename "$stem")-device-waits.json" \
  "$(basename "$stem")-trace.tiotrace" "$(basename "$stem")-plan.json"
echo "total $((SECONDS - start)) s"
