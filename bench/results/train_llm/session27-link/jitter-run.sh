#!/bin/bash
# usage: jitter-run.sh TRACE "HW args" spreads seeds
T=${TERAIO:-build/release/tools/teraio/teraio}  # run from the repository root
trace=$1; hw=$2; spreads=$3; seeds=$4
for j in $spreads; do
  for s in $seeds; do
    $T plan $trace $hw --jitter $j --seed $s -o plan-$j-$s.json > plan-$j-$s.log 2>&1
    $T simulate $trace plan-$j-$s.json $hw --enforce-budget --top 0 > sim-$j-$s.log 2>&1
    step=$(grep -m1 '^step time' sim-$j-$s.log | awk '{print $3}')
    dem=$(grep -m1 '^demand fetches' sim-$j-$s.log | awk '{print $3, $4, $5}')
    stall=$(grep -m1 '^stall ' sim-$j-$s.log | awk '{print $2, $3}')
    off=$(grep -m1 '^host tier' sim-$j-$s.log | awk '{print $4, $5}')
    echo "jitter $j seed $s: step $step stall $stall demand $dem host-out $off"
  done
done
