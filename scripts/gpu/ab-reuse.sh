#!/usr/bin/env bash
# Same-machine A/B of Session(reuse_blocks=...) on W3 with 2 of 32 layers recomputed (the
# configuration of bench/RESULTS.md, sessions 20-23). One W3 run takes about 5 minutes, so each
# call of this script runs one side; run `on` and `off` back to back on one warm machine.
#   bash scripts/gpu/ab-reuse.sh tests      build, then the CUDA tests of reuse_blocks and fetch_flushes
#   bash scripts/gpu/ab-reuse.sh on|off     one W3 run with --reuse-blocks on|off (AB_EXTRA: more arguments)
# Results under $OUT (default ./out): the table, the JSON and the log, without the timeline
# (too large to come back from the device machine).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
side=${1:?usage: ab-reuse.sh tests|on|off}
case "$side" in
  tests | on | off) ;;
  *) echo "ab-reuse.sh: unknown side '$side' (tests, on or off)"; exit 2 ;;
esac
# shellcheck source=scripts/gpu/native-module.sh
. scripts/gpu/native-module.sh
ensure_native_module "$out"
if [ "$side" = tests ]; then
  PYTHONPATH=$(pytest_pythonpath) python3 -m pytest -q -p no:cacheprovider tests/python/test_session_reuse_blocks.py \
    tests/python/test_session_fetch_flushes.py tests/python/test_training_exact.py 2>&1 | tee "$out/pytest-reuse.log"
  exit "${PIPESTATUS[0]}"
fi
runs=${TERAIO_SCRATCH:-/var/tmp/teraio}/ab-reuse-$side
# shellcheck disable=SC2086 # the extra arguments are split on purpose
PYTHONPATH=python python3 bench/train_llm.py --workload W3 --budget 79GiB --modes teraio-recompute \
  --recompute-counts 2 --recompute-measure 1 --warmup 1 --steps 2 --reserve 5GiB --host-budget 100GiB \
  --alloc-conf expandable_segments:True --child-timeout 440 --reuse-blocks "$side" --out "$runs" ${AB_EXTRA:-} \
  2>&1 | tee "$out/w3-reuse-$side.log"
status=${PIPESTATUS[0]}
for f in "$runs"/W3-79GiB.md "$runs"/W3-79GiB.json; do
  [ -f "$f" ] && cp "$f" "$out/w3-reuse-$side-$(basename "$f")"
done
exit "$status"
