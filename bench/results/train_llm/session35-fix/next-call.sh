#!/usr/bin/env bash
# Prepared in session 35 for the next session: one run per call-part on one machine, debug log,
# whose eviction lines now end in "; against the plan: ..." (what the device holds beyond the
# plan's memory: tensors the plan has away, tensors past their profiled release, tensors the
# profile does not know). Run from the repository root; carry .deps.
#   ARM=default|release|release-lead100|lead100|margin256|slack-kernel   WORKLOAD=W3|W2
#   release: --release-tracking on (the profile records when the program frees each storage;
#            off by default since session 6). On the CPU's tiny model it takes every planned
#            step's evictions away (8 a step, all "past their profiled release", to 0).
#   SAVE_TRACE=1: also bring back the profiled trace and the plan (xz), for teraio simulate.
# W3: 16 of 32 recomputed (~250 s a run on a warm machine); W2: 16 GiB, 8 of 8 (~85 s).
# Writes 3 files under $OUT (5 with SAVE_TRACE; the tool brings back at most 8 a call).
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; arm=${ARM:-default}; workload=${WORKLOAD:-W3}
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
extra=(); slack=${TERAIO_POLL_SLACK:-}
case $arm in
  default) ;;
  release) extra=(--release-tracking on) ;;
  release-lead100) extra=(--release-tracking on --early-prefetch-lead 100) ;;
  lead100) extra=(--early-prefetch-lead 100) ;;
  margin256) extra=(--plan-margin 256MiB) ;;
  slack-kernel) slack=kernel ;;
  *) echo "unknown ARM $arm"; exit 2 ;;
esac
[ -n "${SAVE_TRACE:-}" ] && extra+=(--save-trace)
name=$workload-$arm; runs=/var/tmp/teraio/next35-$name
if [ "$workload" = W3 ]; then
  args=(--workload W3 --budget 79GiB --modes teraio-recompute --recompute-counts 16 --recompute-measure 0 --warmup 1
        --steps 3 --reserve 5GiB --host-budget 100GiB --allocator paged --paged-page 16MiB); file=W3-79GiB
else
  args=(--workload W2 --budget 16GiB --modes teraio-recompute --recompute-counts 8 --recompute-measure 0 --warmup 1
        --steps 3 --host-budget 48GiB --allocator paged); file=W2-16GiB
fi
left=$((570 - (SECONDS - start)))
TERAIO_POLL_SLACK=$slack TERAIO_LOG_LEVEL=debug PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py \
  "${args[@]}" "${extra[@]}" --child-timeout "$((left - 5))" --out "$runs" >"$out/$name.log" 2>&1
echo "$name: status $? ($((SECONDS - start)) s)"; grep -E "^\| teraio" "$runs/$file.md"
echo "evictions: $(grep -c 'evict tensor' "$out/$name.log"), demand fetches: $(grep -c 'demand fetch' "$out/$name.log") (all steps)"
# The planned steps' evictions by what the device held beyond the plan (the last measured step).
awk '/step 4\/5 measured/ {s=1} /step 5\/5 measured/ {s=0} s' "$out/$name.log" | grep -oE "against the plan: .*" |
  sed -E 's/\(largest: [^)]*\)//g; s/[0-9]+ bytes in //g' | sort | uniq -c | sort -rn | head -5
grep -E "step .*measured" "$out/$name.log" | sed -E 's/ callbacks.*link:/ link:/' | cut -c1-300
cp "$runs/$file.md" "$out/$name.md"; cp "$runs/$file.json" "$out/$name.json"; xz -T0 "$out/$name.log"
if [ -n "${SAVE_TRACE:-}" ]; then
  for f in "$runs"/*-trace.tiotrace "$runs"/*-plan.json; do [ -f "$f" ] && xz -T0 -c "$f" >"$out/$name-$(basename "$f").xz"; done
fi
echo "total $((SECONDS - start)) s"
