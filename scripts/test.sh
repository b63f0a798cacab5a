#!/usr/bin/env bash
# The test command: installs what it needs, builds, and runs every test — the normal build,
# then the same tests under AddressSanitizer + UndefinedBehaviorSanitizer, the format check,
# and each libFuzzer target for a short time. Works on a fresh Debian 12 machine.
#   bash scripts/test.sh            everything
#   TERAIO_QUICK=1 bash scripts/test.sh   normal build and tests only
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)
fuzz_seconds=${TERAIO_FUZZ_SECONDS:-30}

step() { printf '\n=== %s\n' "$*"; }

step "dependencies"
bash scripts/install-deps.sh

step "format check (clang-format)"
mapfile -t sources < <(git ls-files '*.cpp' '*.hpp' 2>/dev/null || find include src tests tools bench fuzz -name '*.[ch]pp')
if ((${#sources[@]})); then clang-format --dry-run --Werror "${sources[@]}"; fi

step "build (RelWithDebInfo)"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
ninja -C build/release -j "$jobs"

step "tests"
ctest --test-dir build/release --output-on-failure -j "$jobs"

if [ -n "${TERAIO_QUICK:-}" ]; then exit 0; fi

step "build under AddressSanitizer + UBSan"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTERAIO_SANITIZE=ON \
  -DTERAIO_BUILD_BENCHMARKS=OFF -DTERAIO_WITH_CUDA=OFF -DTERAIO_WITH_TORCH=OFF -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
ninja -C build/asan -j "$jobs"

step "tests under AddressSanitizer + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j "$jobs"

step "fuzzers (${fuzz_seconds}s each)"
if compgen -G "fuzz/fuzz_*.cpp" >/dev/null; then
  cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DTERAIO_BUILD_FUZZERS=ON -DTERAIO_BUILD_TESTS=OFF -DTERAIO_BUILD_BENCHMARKS=OFF -DTERAIO_WITH_CUDA=OFF \
    -DTERAIO_WITH_URING=OFF -DTERAIO_WITH_TORCH=OFF -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
  # Only the fuzz targets: the libraries carry coverage instrumentation in this build, which
  # the other executables (linked without the fuzzer runtime) cannot link against.
  mapfile -t fuzz_targets < <(for f in fuzz/fuzz_*.cpp; do basename "$f" .cpp; done)
  ninja -C build/fuzz -j "$jobs" "${fuzz_targets[@]}"
  for source in fuzz/fuzz_*.cpp; do
    name=$(basename "$source" .cpp)
    corpus=$root/build/fuzz/corpus/$name
    mkdir -p "$corpus"
    [ -d "fuzz/seeds/$name" ] && cp -n fuzz/seeds/"$name"/* "$corpus"/ 2>/dev/null || true
    echo "fuzzing $name"
    "build/fuzz/fuzz/$name" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -print_final_stats=1 "$corpus" 2>&1 | tail -n 4
  done
fi

echo
echo "all tests passed"
