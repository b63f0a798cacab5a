#!/bin/bash
# stall-search-cmp.sh NAME TRACE.xz SCALE "HW" "VARIANTS" (each variant: extra planner args, e.g. "--stall-patience 6")
T=${TERAIO:-build/release/tools/teraio/teraio}  # run from the repository root
name=$1; xz=$2; scale=$3; hw=$4; shift 4
[ -f $name.tiotrace ] || xz -dkc $xz > $name.tiotrace
i=0
for v in "$@"; do
  i=$((i+1))
  $T plan $name.tiotrace $hw --time-scale $scale $v -o $name-v$i.json > $name-v$i.plan.log 2>&1
  $T simulate $name.tiotrace $name-v$i.json $hw --time-scale $scale --enforce-budget --top 0 > $name-v$i.sim.log 2>&1
  echo "$name [$v]: step $(grep -m1 '^step time' $name-v$i.sim.log | awk '{print $3}') | $(grep -o 'planned with [^:]*' $name-v$i.plan.log) | $(grep -o 'planned in [0-9.]* [a-z]*' $name-v$i.plan.log) | $(grep -m1 '^demand' $name-v$i.sim.log | tr -s ' ')"
done
