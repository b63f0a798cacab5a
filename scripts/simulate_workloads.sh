#!/bin/bash
# Plans and simulates the synthetic W1-W3 traces (shared/WORKLOADS.md) at their budgets on the
# H100 machine's figures (PCIe 55 GB/s each way, SSD 2.2 GB/s write / 1.7 GB/s read, no GDS,
# host tier 100 GiB) and prints the simulated share of ideal as a Markdown table. The budget
# is kept hard (--enforce-budget): a plan's shortfall shows up as stall time.
# Usage: scripts/simulate_workloads.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-sim-workloads}
TERAIO="$BUILD/tools/teraio/teraio"
mkdir -p "$OUT"
HW=(--host-capacity 100GiB --ssd-capacity 1TiB --pcie 55GB/s --ssd-write 2.2GB/s --ssd-read 1.7GB/s --latency 20us)
for w in w1 w2 w3; do
  [ -f "$OUT/$w.tiotrace" ] || "$TERAIO" synth --preset "$w" --gpu h100 -o "$OUT/$w.tiotrace" > "$OUT/$w.synth.txt"
done
echo "| workload | budget | plan feasible | simulated step (s) | ideal (s) | share of ideal | bandwidth bound | stall (s) | peak (GiB) | host peak (GiB) | evictions | violations |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for case in "w1 36GiB" "w1 24GiB" "w2 24GiB" "w2 16GiB" "w3 76GiB"; do
  set -- $case
  name="$1_$2"
  # Exit status 3 (an invariant broken) is a result to tabulate; anything else is a failure,
  # and a summary left from an earlier run must not be reported in its place.
  rm -f "$OUT/$name.json"
  rc=0
  "$TERAIO" simulate "$OUT/$1.tiotrace" --budget "$2" "${HW[@]}" --enforce-budget --save-plan "$OUT/$name.plan" \
    --summary "$OUT/$name.json" > "$OUT/$name.txt" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "simulate_workloads: teraio simulate failed for $name (exit $rc), see $OUT/$name.txt" >&2
    exit "$rc"
  fi
  /usr/bin/python3 - "$OUT/$name.json" "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
g = 1024 ** 3
print(f"| {sys.argv[2].upper()} | {sys.argv[3]} | {'yes' if s['plan_feasible'] else 'no'} | {s['step_s']:.3f} | "
      f"{s['ideal_s']:.3f} | {100 * s['share_of_ideal']:.1f}% | <= {100 * s['bound_share']:.1f}% | {s['stall_s']:.3f} | {s['peak_bytes'] / g:.1f} | "
      f"{s['host_peak_bytes'] / g:.1f} | {s['evictions']} | {s['violations']} |")
PY
done
