#!/usr/bin/env bash
# One W3 run of sessions 20-22's configuration (2 of 32 layers recomputed); $1 names it, the rest are extra flags.
name=$1; shift
mkdir -p /root/r23
PYTHONPATH=python python3 bench/train_llm.py --workload W3 --budget 79GiB --modes teraio-recompute \
  --recompute-counts 2 --recompute-measure 1 --warmup 1 --steps 2 --reserve 5GiB --host-budget 100GiB \
  --alloc-conf expandable_segments:True --child-timeout 440 --out /root/r23/$name "$@" 2>&1 | tee $OUT/$name.log
cp /root/r23/$name/*.md /root/r23/$name/*.json $OUT/ 2>/dev/null
for f in /root/r23/$name/*.md /root/r23/$name/*.json; do [ -f "$f" ] && cp "$f" "$OUT/$name-$(basename "$f")"; done
rm -f $OUT/W3-79GiB.md $OUT/W3-79GiB.json
