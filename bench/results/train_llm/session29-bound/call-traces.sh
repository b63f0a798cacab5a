#!/usr/bin/env bash
# Session 29, call 1: build, the CUDA copier tests (the abandon path after 2cdd122), then W3
# profiles of 1, 3, 5 and 10 recomputed layers with --save-trace for bench/bounds.py. The traces
# do not depend on the planner, so each count only profiles and plans (--recompute-measure 0,
# 2 rounds of the stall search); the count the tuner picks then runs one step.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/traces29
. scripts/gpu/native-module.sh; ensure_native_module "$out"
{ cmake -S . -B build/gpu-io -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_WITH_CUDA=ON -DTERAIO_BUILD_BENCHMARKS=OFF \
    -DTERAIO_WERROR=OFF >/dev/null && ninja -C build/gpu-io -j 16 teraio_io_cuda_tests >/dev/null &&
  build/gpu-io/tests/io/teraio_io_cuda_tests --gtest_filter='CudaCopier.*'; } >"$out/cuda-copier-tests.log" 2>&1
echo "copier tests: status $? ($((SECONDS - start)) s)"; tail -n 3 "$out/cuda-copier-tests.log"
left=$((520 - (SECONDS - start)))
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 1,3,5,10 --recompute-measure 0 --warmup 0 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --stall-rounds 2 --save-trace --child-timeout "$((left - 5))" \
  --out "$runs" 2>&1 | tee "$out/w3-traces.log"
python3 -c 'import lzma, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*-c*-trace.tiotrace")):
    (pathlib.Path(sys.argv[2]) / (f.name + ".xz")).write_bytes(lzma.compress(f.read_bytes(), preset=6))' "$runs" "$out"
cp "$runs"/W3-79GiB.md "$runs"/W3-79GiB.json "$out/" 2>/dev/null; ls -la "$out"; echo "total $((SECONDS - start)) s"
