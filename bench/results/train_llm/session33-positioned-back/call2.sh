#!/usr/bin/env bash
# Session 33, call 2: W1 at both budgets with the default plan margin (64 MiB, since session 32),
# the commands of the W1 rows in the README (sessions 17 and 29); W1 @ 36 GiB also with
# --plan-margin 0, in the same call, on the same machine.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s33c2
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
run() {  # name, then train_llm.py arguments
  local name=$1; shift
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 240 python3 bench/train_llm.py "$@" --host-budget 40GiB \
    --alloc-conf expandable_segments:True --child-timeout 150 --out "$runs/$name" >"$out/$name.log" 2>&1
  echo "$name: status $? ($((SECONDS - start)) s)"
  grep -hE "^\| (ideal|teraio|ckpt)|^- teraio" "$runs/$name"/W1-*.md; cp "$runs/$name"/W1-*.md "$out/$name.md"
}
run w1-36-default --workload W1 --budget 36GiB --modes ideal,teraio-recompute --recompute-counts 0
run w1-36-margin0 --workload W1 --budget 36GiB --modes ideal,teraio-recompute --recompute-counts 0 --plan-margin 0
run w1-24-default --workload W1 --budget 24GiB --modes ideal,teraio-recompute,ckpt --recompute-counts 14,12,10
echo "total $((SECONDS - start)) s"
