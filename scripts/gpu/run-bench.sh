#!/usr/bin/env bash
# The end-to-end benchmark (bench/train_llm.py) on the GPU machine. Builds teraio._native with
# scripts/gpu/run-torch.sh unless a module is already in python/teraio (carried from an earlier
# run of the same sources: run-torch.sh returns it under $OUT), then runs one table per job of
# TERAIO_BENCH ("WORKLOAD:BUDGET:MODES[:EXTRA ARGS]", space-separated; EXTRA ARGS use commas
# for spaces). Results under $OUT/bench.
#   TERAIO_BENCH="W1:24GiB:ideal,teraio-host,ckpt" bash scripts/gpu/run-bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/out}
mkdir -p "$out/bench"
python=$(command -v python3)
status=0
# shellcheck source=scripts/gpu/native-module.sh
. scripts/gpu/native-module.sh
ensure_native_module "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
for job in ${TERAIO_BENCH:-"W1:24GiB:ideal,teraio-host,ckpt,save_on_cpu,fsdp2-offload"}; do
  IFS=: read -r workload budget modes extra <<<"$job"
  printf '\n=== %s at %s: %s (%s)\n' "$workload" "$budget" "$modes" "$(date -u +%H:%M:%S)"
  # shellcheck disable=SC2086 # the extra arguments are split on purpose
  PYTHONPATH=python "$python" bench/train_llm.py --workload "$workload" --budget "$budget" --modes "$modes" \
    --out "$out/bench" ${extra//,/ } || status=1
done
exit $status
