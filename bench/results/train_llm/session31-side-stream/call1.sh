#!/usr/bin/env bash
# Session 31, call 1: build main's module and the side-stream branch's (build-wt/side, carried),
# run both builds' CUDA copier tests, then W3 with 16 of 32 recomputed on main (1 warm-up, 1 measured).
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s31
. scripts/gpu/native-module.sh
copier_tests() {  # $1 source root
  (cd "$1" && cmake -S . -B build/gpu-io -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_WITH_CUDA=ON \
     -DTERAIO_BUILD_BENCHMARKS=OFF -DTERAIO_WERROR=OFF >/dev/null && ninja -C build/gpu-io -j 6 teraio_io_cuda_tests >/dev/null)
}
ln -sfn ../../.deps build-wt/side/.deps
copier_tests . >"$out/cuda-build-main.log" 2>&1 & b1=$!
copier_tests build-wt/side >"$out/cuda-build-side.log" 2>&1 & b2=$!
(cd build-wt/side && mkdir -p /tmp/side-out && OUT=/tmp/side-out TERAIO_GPU_PARTS=none bash scripts/gpu/run-torch.sh >/tmp/side-out/build.log 2>&1; echo "side module: status $?") & b3=$!
TERAIO_REBUILD=1 ensure_native_module "$out"; echo "main module built ($((SECONDS - start)) s)"
wait $b1 $b2 $b3; echo "builds done ($((SECONDS - start)) s)"; tail -n 3 /tmp/side-out/build.log; ls build-wt/side/python/teraio/_native*.so
for side in main side; do
  root=.; [ $side = side ] && root=build-wt/side
  "$root"/build/gpu-io/tests/io/teraio_io_cuda_tests --gtest_filter='CudaCopier.*' >"$out/copier-tests-$side.log" 2>&1
  echo "copier tests $side: status $?"; grep -E "OK|FAILED|PASSED|Failure|Expected|Which is" "$out/copier-tests-$side.log" | head -30
done
left=$((590 - (SECONDS - start)))
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 16 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --child-timeout "$((left - 5))" \
  --out "$runs/main-c16" >"$out/w3-c16-main.log" 2>&1
echo "W3 main: status $? ($((SECONDS - start)) s)"; grep -E "planned with|step .*(measured|warm-up)" "$out/w3-c16-main.log" | cut -c1-400
grep -o "link: .*" "$out/w3-c16-main.log"; grep -E "PCIe link" "$out/w3-c16-main.log"
cp "$runs"/main-c16/W3-79GiB.md "$out/main-c16-W3-79GiB.md" 2>/dev/null; cp "$runs"/main-c16/W3-79GiB.json "$out/main-c16-W3-79GiB.json" 2>/dev/null
echo "total $((SECONDS - start)) s"
