#!/usr/bin/env bash
# Session 34, call 4: the ideals on this (H200) machine, so that calls 1-3 have a share of ideal:
# W3 by layer extrapolation (2, 4 layers; check at 3), as session 4; W2 without a limit.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s34c4
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 330 python3 bench/train_llm.py --workload W3 --budget 79GiB --modes ideal \
  --extrapolate 2,4,3 --warmup 1 --steps 3 --child-timeout 320 --out "$runs/w3" >"$out/w3-ideal.log" 2>&1
echo "W3 ideal: status $? ($((SECONDS - start)) s)"; grep -hE "^\| ideal|extrapolat" "$runs/w3"/W3-*.md | cut -c1-300
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 200 python3 bench/train_llm.py --workload W2 --budget 16GiB --modes ideal \
  --warmup 1 --steps 3 --child-timeout 190 --out "$runs/w2" >"$out/w2-ideal.log" 2>&1
echo "W2 ideal: status $? ($((SECONDS - start)) s)"; grep -hE "^\| ideal" "$runs/w2"/W2-*.md
cat "$runs/w3"/W3-*.md "$runs/w2"/W2-*.md > "$out/ideals.md"; xz -T0 "$out/w3-ideal.log" "$out/w2-ideal.log"
echo "total $((SECONDS - start)) s"
