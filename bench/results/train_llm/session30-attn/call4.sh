#!/usr/bin/env bash
# Session 30, call 4: the copier's link activity (new): the CUDA copier tests, then W3 with 1 of
# 32 layers recomputed (default search), one warm-up and one measured step, link per step.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s30c4
. scripts/gpu/native-module.sh
{ cmake -S . -B build/gpu-io -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_WITH_CUDA=ON -DTERAIO_BUILD_BENCHMARKS=OFF \
    -DTERAIO_WERROR=OFF >/dev/null && ninja -C build/gpu-io -j 8 teraio_io_cuda_tests >/dev/null; } >"$out/cuda-build.log" 2>&1 &
builder=$!
TERAIO_REBUILD=1 ensure_native_module "$out"
wait "$builder"; echo "builds done ($((SECONDS - start)) s)"
build/gpu-io/tests/io/teraio_io_cuda_tests --gtest_filter='CudaCopier.*' >"$out/cuda-copier-tests.log" 2>&1
echo "copier tests: status $?"; grep -E "to device:|OK|FAILED|PASSED|Failure|Expected|Which is" "$out/cuda-copier-tests.log" | head -20
left=$((590 - (SECONDS - start)))
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --child-timeout "$((left - 5))" \
  --out "$runs" >"$out/w3-c1-link.log" 2>&1
echo "status $? ($((SECONDS - start)) s)"; grep -E "step .*(measured|warm-up)|link" "$out/w3-c1-link.log" | cut -c1-300
grep -o "link: .*" "$out/w3-c1-link.log"
cp "$runs"/W3-79GiB.md "$runs"/W3-79GiB.json "$out/" 2>/dev/null; echo "total $((SECONDS - start)) s"
