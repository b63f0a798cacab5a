#!/usr/bin/env bash
# Session 32, call 1: the CUDA tests of positioning and the plan margin, then W3 with 1 of 32
# layers recomputed, two measured steps, evictions and demand fetches logged
# (TERAIO_LOG_LEVEL=debug), device waits against the simulation; as session 31's call 7, with
# the default plan margin (64 MiB) and position_for_plan().
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=${RUNS:-/var/tmp/teraio/s32c1}
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
[ -x build/gpu/tools/teraio/teraio ] || ninja -C build/gpu teraio >/dev/null
PYTHONPATH=$(pytest_pythonpath) timeout 150 python3 -m pytest -q -p no:cacheprovider tests/python/test_training_exact.py \
  -k "cuda and (margin or first_planned_step or budget_holds)" >"$out/pytest.log" 2>&1
echo "pytest: status $? ($((SECONDS - start)) s)"; tail -n 3 "$out/pytest.log"
left=$((555 - (SECONDS - start)))
TERAIO_LOG_LEVEL=debug PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1 --recompute-measure 0 --warmup 1 --steps 2 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --save-trace --child-timeout "$((left - 5))" \
  --out "$runs" >"$out/w3-c1-2steps.log" 2>&1
echo "W3 c1 two steps: status $? ($((SECONDS - start)) s)"; grep -E "PCIe link|kept free" "$out/w3-c1-2steps.log"; grep -E "^\| teraio" "$runs/W3-79GiB.md"
grep -cE "debug.*evict tensor" "$out/w3-c1-2steps.log"; grep -cE "debug.*demand fetch" "$out/w3-c1-2steps.log"
grep -E "step .*measured" "$out/w3-c1-2steps.log" | cut -c1-300
stem=$runs/W3-79GiB-teraio-recompute
for s in 2 3; do timeout 60 python3 bench/device_stalls.py "$stem-device-waits.json" --step $s --trace "$stem-trace.tiotrace" --plan "$stem-plan.json" --teraio build/gpu/tools/teraio/teraio --worst 5 >"$out/device-stalls-$s.txt" 2>&1; head -n 3 "$out/device-stalls-$s.txt"; done
xz -T0 "$out/w3-c1-2steps.log"
tar -C "$runs" -I "xz -T0" -cf "$out/c1-2steps-saved.tar.xz" W3-79GiB.md W3-79GiB.json "$(basename "$stem")-device-waits.json" \
  "$(basename "$stem")-trace.tiotrace" "$(basename "$stem")-plan.json"
echo "total $((SECONDS - start)) s"
