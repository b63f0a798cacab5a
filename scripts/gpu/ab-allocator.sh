#!/usr/bin/env bash
# Same-machine A/B of the CUDA allocator (teraio.paged against PyTorch's caching allocator with
# expandable segments) on W3 with 2 of 32 layers recomputed (bench/RESULTS.md, sessions 20-25).
# One W3 run (3 measured steps) takes about 5 minutes, so each call of this script runs one side;
# run `paged` and `caching` back to back on one warm machine.
#   bash scripts/gpu/ab-allocator.sh tests            build, then the CUDA tests of the paged allocator
#   bash scripts/gpu/ab-allocator.sh exact            W3 with 4 layers at 24 GiB, ideal and teraio-host, paged
#   bash scripts/gpu/ab-allocator.sh paged|caching    one W3 run (AB_EXTRA: more arguments)
# Results under $OUT (default ./out): the table, the JSON and the log, without the timeline.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
side=${1:?usage: ab-allocator.sh tests|exact|paged|caching}
case "$side" in
  tests | exact | paged | caching) ;;
  *) echo "ab-allocator.sh: unknown side '$side' (tests, exact, paged or caching)"; exit 2 ;;
esac
# shellcheck source=scripts/gpu/native-module.sh
. scripts/gpu/native-module.sh
ensure_native_module "$out"
if [ "$side" = tests ]; then
  PYTHONPATH=$(pytest_pythonpath) python3 -m pytest -q -p no:cacheprovider tests/python/test_paged_allocator.py \
    tests/python/test_session_fetch_flushes.py 2>&1 | tee "$out/pytest-paged.log"
  exit "${PIPESTATUS[0]}"
fi
runs=${TERAIO_SCRATCH:-/var/tmp/teraio}/ab-allocator-$side
if [ "$side" = exact ]; then
  # shellcheck disable=SC2086 # the extra arguments are split on purpose
  PYTHONPATH=python python3 bench/train_llm.py --workload W3 --layers 4 --budget 24GiB --modes ideal,teraio-host \
    --warmup 1 --steps 3 --host-budget 40GiB --allocator paged --child-timeout 200 --out "$runs" ${AB_EXTRA:-} \
    2>&1 | tee "$out/w3-4layers-paged.log"
  status=${PIPESTATUS[0]}
  for f in "$runs"/W3-4L-24GiB.md "$runs"/W3-4L-24GiB.json; do
    [ -f "$f" ] && cp "$f" "$out/exact-$(basename "$f")"
  done
  exit "$status"
fi
allocator=(--allocator paged)
[ "$side" = caching ] && allocator=(--alloc-conf expandable_segments:True)
# shellcheck disable=SC2086 # the extra arguments are split on purpose
PYTHONPATH=python python3 bench/train_llm.py --workload W3 --budget 79GiB --modes teraio-recompute \
  --recompute-counts 2 --recompute-measure 1 --warmup 1 --steps 3 --reserve 5GiB --host-budget 100GiB \
  "${allocator[@]}" --child-timeout 440 --out "$runs" ${AB_EXTRA:-} 2>&1 | tee "$out/w3-$side.log"
status=${PIPESTATUS[0]}
for f in "$runs"/W3-79GiB.md "$runs"/W3-79GiB.json; do
  [ -f "$f" ] && cp "$f" "$out/w3-$side-$(basename "$f")"
done
exit "$status"
