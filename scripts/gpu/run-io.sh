#!/usr/bin/env bash
# Exercises the storage engine's GPU paths on the GPU machine (H100, CUDA 13, no liburing or
# fio package, root): builds with CUDA and the carried .deps (made here by scripts/gpu/stage-deps.sh,
# which stages GoogleTest, nlohmann-json, xxHash and liburing), runs the io tests (CUDA copier and cuFile
# included), `teraio doctor`, and `teraio iobench --device cuda` on one path and on two
# directories of the same disk. Everything goes under $OUT (default ./out). About 5 minutes.
# Run from the repository root:   bash scripts/gpu/run-io.sh
# The bench data files are left in $TERAIO_BENCH_DIR on purpose: deleting multi-GiB files
# stalls that disk for minutes. The machine is discarded afterwards anyway.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/out}
mkdir -p "$out"
exec > >(tee "$out/run-io.log") 2>&1
build=${TERAIO_BUILD_DIR:-build/gpu}
bench_dir=${TERAIO_BENCH_DIR:-/var/tmp/teraio-iobench}
volume=${TERAIO_IO_VOLUME:-4GiB}
status=0
# libcufile writes its log into the working directory unless told otherwise: keep it with the results.
export CUFILE_LOGFILE_PATH=${CUFILE_LOGFILE_PATH:-$out/cufile.log}

step() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
fail() { echo "run-io: FAILED: $*"; status=1; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
df -hT "$PWD" /var/tmp | cat
ls /usr/local/cuda/lib64 2>/dev/null | grep -i cufile || echo "no libcufile under /usr/local/cuda/lib64"
lsmod 2>/dev/null | grep -i nvidia_fs || echo "nvidia_fs kernel module not loaded"

step "configure (Release, CUDA on)"
python=$(command -v python3 || true)
# Warnings are not errors here: a newer compiler (GCC 13 there) may add warnings of its own, which
# must not stop the measurement; CI keeps -Werror.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_WITH_CUDA=ON -DTERAIO_BUILD_BENCHMARKS=OFF \
  -DTERAIO_WERROR=OFF \
  ${python:+-DPython3_EXECUTABLE=$python} | tail -n 14 || { fail "configure"; exit 1; }

step "build"
ninja -C "$build" -j "$(nproc)" teraio teraio_io_cuda_tests || { fail "build"; exit 1; }
tests=(teraio_io_cuda_tests)
if ninja -C "$build" -j "$(nproc)" teraio_io_tests; then tests+=(teraio_io_tests); else fail "build of teraio_io_tests"; fi
teraio=$build/tools/teraio/teraio

step "io tests (CUDA copier, cuFile, iobench, tier store)"
mkdir -p "$bench_dir/a" "$bench_dir/b"
for t in "${tests[@]}"; do
  # TMPDIR on the bench disk: the cuFile registration test needs a real O_DIRECT file there.
  TMPDIR=$bench_dir/a "$build/tests/io/$t" --gtest_output="xml:$out/$t.xml" >"$out/$t.txt" 2>&1
  rc=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |Failure|cuFile status|cuFileHandleRegister|CUDA device|CUDA:|refused' "$out/$t.txt"
  [ "$rc" -eq 0 ] || fail "$t (exit $rc; full output in $out/$t.txt)"
done

step "teraio doctor"
"$teraio" doctor --paths "$bench_dir/a,$bench_dir/b" | tee "$out/doctor.txt" || fail "doctor"

step "iobench: one path, --device cuda, $volume per mode"
"$teraio" iobench --device cuda --repeat "${TERAIO_IO_REPEAT:-1}" --paths "$bench_dir/a" --volume "$volume" --json "$out/iobench-1path.json" \
  | tee "$out/iobench-1path.txt" || fail "iobench one path"

step "iobench: two directories of the same disk (striped), --device cuda, $volume per mode"
"$teraio" iobench --device cuda --repeat "${TERAIO_IO_REPEAT:-1}" --paths "$bench_dir/a,$bench_dir/b" --volume "$volume" --no-host-tier \
  --json "$out/iobench-2paths.json" | tee "$out/iobench-2paths.txt" || fail "iobench two paths"

step "summary"
if [ -n "$python" ]; then
  "$python" - "$out/iobench-1path.json" "$out/iobench-2paths.json" <<'PY' | tee "$out/summary.txt"
import json, sys
print(f"{'mode':<20}{'direction':<14}{'paths':<6}{'backend':<34}{'GB/s':>7}{'raw GB/s':>10}{'ratio':>7}  target")
for name in sys.argv[1:]:
    try:
        rows = json.load(open(name))["results"]
    except (OSError, ValueError) as e:
        print(f"{name}: {e}")
        continue
    for r in rows:
        judged = r["raw_gb_per_s"] > 0
        verdict = ("ok" if r["ratio"] >= 0.9 else "BELOW 90%") if judged else "(reference)"
        ratio = f"{100 * r['ratio']:.0f}%" if judged else "-"
        raw = f"{r['raw_gb_per_s']:.2f}" if judged else "-"
        print(f"{r['mode']:<20}{r['direction']:<14}{r['paths']:<6}{r['backend']:<34}{r['gb_per_s']:>7.2f}{raw:>10}{ratio:>7}  {verdict}")
PY
else
  grep -hE '^(raw|ssd|bounce|host)' "$out"/iobench-*.txt
fi
grep -h "device-memory I/O" "$out/doctor.txt" | sort -u
echo
[ "$status" -eq 0 ] && echo "run-io: all steps passed" || echo "run-io: some steps FAILED (see above)"
exit "$status"
