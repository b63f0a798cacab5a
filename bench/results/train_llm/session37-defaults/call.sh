#!/usr/bin/env bash
# Session 37's GPU call: several arms of session 36's next-call.sh on one machine, each with its
# own output folder, all tarred into $OUT/call.tar (a call brings back at most 8 files).
#   RUNS="W2-24:new W2-24:old ..."   the WORKLOAD:ARM pairs, in order
#                                    (W3-cN: W3 with N of 32 recomputed, otherwise as next-call.sh's
#                                    W3, with --save-trace; ARM new = the defaults, share0 =
#                                    --min-migration-share 0, the plans before session 37's change)
#   EXACT=1                          first run the exact suite's CUDA cases (after the build)
# Run from the repository root; carry .deps.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}
work=/var/tmp/s37/$(date +%s)  # one folder a call: names repeat from call to call
mkdir -p "$work" "$out"
. scripts/gpu/native-module.sh
. scripts/gpu/bench-arm.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
if [ -n "${EXACT:-}" ]; then
  PYTHONPATH=$(pytest_pythonpath) timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_training_exact.py -k cuda >"$work/exact.log" 2>&1
  echo "exact suite (cuda): status $? ($((SECONDS - start)) s)"; tail -n 5 "$work/exact.log"
  tar -C "$work" -rf "$out/call.tar" exact.log
fi
i=0
for run in ${RUNS:-}; do
  i=$((i + 1)); name=$i-${run/:/-}
  mkdir -p "$work/$name"
  workload=${run%%:*}
  if [[ $workload == W3-c* ]]; then
    extra=(); [ "${run##*:}" = share0 ] && extra=(--min-migration-share 0)
    LEFT=$((590 - (SECONDS - start))) bench_arm "$work/$name" "$name" W3-79GiB --workload W3 --budget 79GiB \
      --modes teraio-recompute --recompute-counts "${workload#W3-c}" --recompute-measure 0 --warmup 1 --steps 3 \
      --reserve 5GiB --host-budget 100GiB --allocator paged --paged-page 16MiB --save-trace "${extra[@]}"
    # the trace, plan and device waits, for teraio simulate and bench/device_stalls.py here
    runs=$(cd /var/tmp/teraio && ls -dt "$name"-*/ | head -n 1)  # this call's run of that name
    tar -C /var/tmp/teraio -cJf "$work/$name/saved.tar.xz" $(cd /var/tmp/teraio && ls -d "$runs"*trace* \
      "$runs"*plan* "$runs"*device-waits* 2>/dev/null)
    # the last measured step's device waits by where their copies stood and by the size due
    python3 bench/device_stalls.py "/var/tmp/teraio/$runs"W3-79GiB-teraio-recompute-device-waits.json \
      --plan "/var/tmp/teraio/$runs"W3-79GiB-teraio-recompute-plan.json | tee "$work/$name/stalls.txt"
  else
    OUT=$work/$name WORKLOAD=$workload ARM=${run##*:} bash bench/results/train_llm/session36-release/next-call.sh
  fi
  tar -C "$work" -rf "$out/call.tar" "$name"
  echo "after $name: $((SECONDS - start)) s"
done
