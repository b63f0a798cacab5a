#!/usr/bin/env bash
# Session 37's GPU call: several arms of session 36's next-call.sh on one machine, each with its
# own output folder, all tarred into $OUT/call.tar (a call brings back at most 8 files).
#   RUNS="W2-24:new W2-24:old ..."   the WORKLOAD:ARM pairs, in order
#   EXACT=1                          first run the exact suite's CUDA cases (after the build)
# Run from the repository root; carry .deps.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}
work=/var/tmp/s37
mkdir -p "$work" "$out"
. scripts/gpu/native-module.sh
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
  OUT=$work/$name WORKLOAD=${run%%:*} ARM=${run##*:} bash bench/results/train_llm/session36-release/next-call.sh
  tar -C "$work" -rf "$out/call.tar" "$name"
  echo "after $name: $((SECONDS - start)) s"
done
