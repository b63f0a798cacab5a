#!/usr/bin/env bash
# Same-machine A/B of the profile's release tracking (--release-tracking on/off) on one W2
# budget: AB_BUDGET (default 24GiB), AB_MODES (default teraio-host,teraio-recompute), AB_EXTRA
# (more bench arguments). Builds the module unless one is carried in python/teraio.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/out}
mkdir -p "$out"
if ! ls python/teraio/_native*.so >/dev/null 2>&1; then
  TERAIO_GPU_PARTS=none bash scripts/gpu/run-torch.sh >"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
fi
common="--workload W2 --budget ${AB_BUDGET:-24GiB} --modes ${AB_MODES:-teraio-host,teraio-recompute} --alloc-conf expandable_segments:True ${AB_EXTRA:-}"
for tracking in on off; do
  # shellcheck disable=SC2086 # the arguments are split on purpose
  PYTHONPATH=python python3 bench/train_llm.py $common --release-tracking $tracking --out "$out/$tracking" 2>&1 |
    grep -E "^\| |trial|warn" | cut -c1-400
done
rm -f "$out"/*/*timeline.json
