#!/usr/bin/env bash
# Session 41, offline: plan the saved W3 traces of 4 and 8 of 32 recomputed again with planner
# knobs, and simulate each plan as the runtime would run it (RESULTS.md, session 41, "After the
# calls: the planner's knobs"). About 6 minutes a trace on a 2-core machine.
# Usage, from the repository root after building: bash bench/results/train_llm/session41-hostwaits-in/knobs.sh
set -euo pipefail
here=bench/results/train_llm/session41-hostwaits-in
T=${TERAIO:-build/release/tools/teraio/teraio}
work=$(mktemp -d)
tar -C "$work" -xJf $here/call5/saved.tar.xz
tar -C "$work" -xJf $here/call1/1-W3-c8-hostwaitsin/saved.tar.xz
c4=$(ls "$work"/*/W3-79GiB-teraio-recompute-c4-trace.tiotrace)
c8=$(ls "$work"/*/W3-79GiB-teraio-recompute-trace.tiotrace)
# The runs' hardware (their plans' hardware lines) and budget less the 64 MiB plan margin.
base=(--budget 75712MiB --host-capacity 100GiB --d2h 50557082028 --h2d 50025392546)
for tr in c4 c8; do
  while read -r name opts; do
    # shellcheck disable=SC2086  # opts is a list of options
    # teraio plan exits 3 when no plan fits the budget without stalls (these), and still writes it.
    "$T" plan "${!tr}" "${base[@]}" $opts -o "$work/$tr-$name.json" >"$work/$tr-$name.log" 2>&1 || true
    [ -s "$work/$tr-$name.json" ] || { cat "$work/$tr-$name.log" >&2; exit 1; }
    step=$("$T" simulate "${!tr}" "$work/$tr-$name.json" --enforce-budget --budget 74GiB | awk '/step time/ {print $3}')
    echo "$tr $name $opts: $step s ($(grep -o 'planned in [0-9.]* s' "$work/$tr-$name.log"))"
  done <<'KNOBS'
base
rounds128 --stall-rounds 128 --stall-patience 20
damp25 --stall-damping 0.25 --stall-rounds 128 --stall-patience 20
damp75 --stall-damping 0.75
lead3 --early-prefetch-lead 3
credit --over-budget-credit
KNOBS
done
rm -rf "$work"
