#!/usr/bin/env bash
# Prepared in session 36 for the next: the new defaults (releases recorded, prefetch lead 100)
# against the old ones on the workloads session 36 did not run. Run from the repository root;
# carry .deps. One run a call-part; debug log; writes 3 files under $OUT (scripts/gpu/bench-arm.sh).
#   ARM=new|old   (old: --release-tracking off --early-prefetch-lead 3, the defaults until session 36)
#   WORKLOAD=W2-24 (1 of 8 recomputed, ~90 s warm) | W1-24 (12 of 16: 14 runs passive, 12 moves
#            ~0.2 GiB; ~100 s) | W3 (16 of 32, ~265 s) | W2-16 (8 of 8, ~85 s)
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; arm=${ARM:-new}; workload=${WORKLOAD:-W2-24}
. scripts/gpu/native-module.sh
. scripts/gpu/bench-arm.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
case $arm in
  new) extra=() ;;
  old) extra=(--release-tracking off --early-prefetch-lead 3) ;;
  *) echo "unknown ARM $arm"; exit 2 ;;
esac
case $workload in
  W2-24) args=(--workload W2 --budget 24GiB --recompute-counts 1 --host-budget 48GiB --allocator paged); file=W2-24GiB ;;
  W2-16) args=(--workload W2 --budget 16GiB --recompute-counts 8 --host-budget 48GiB --allocator paged); file=W2-16GiB ;;
  W1-24) args=(--workload W1 --budget 24GiB --recompute-counts 12 --host-budget 40GiB
               --alloc-conf expandable_segments:True); file=W1-24GiB ;;
  W3) args=(--workload W3 --budget 79GiB --recompute-counts 16 --reserve 5GiB --host-budget 100GiB
            --allocator paged --paged-page 16MiB); file=W3-79GiB ;;
  *) echo "unknown WORKLOAD $workload"; exit 2 ;;
esac
LEFT=$((570 - (SECONDS - start))) bench_arm "$out" "$workload-$arm" "$file" "${args[@]}" --modes teraio-recompute \
  --recompute-measure 0 --warmup 1 --steps 3 "${extra[@]}"
echo "total $((SECONDS - start)) s"
