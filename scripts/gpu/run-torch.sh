#!/usr/bin/env bash
# The PyTorch runtime and safetensors on the GPU machine (H100, torch 2.11 CUDA, no registry):
# builds teraio._native against that torch with the carried .deps (scripts/gpu/stage-deps.sh),
# runs the runtime's C++ tests, the Python tests (CPU and CUDA), the demo on CUDA, a
# transformers Llama under half its footprint (exactness, overhead when it fits) and the
# safetensors loading benchmark. Results under $OUT (default ./out).
#   bash scripts/gpu/run-torch.sh                   everything (about 8 minutes)
#   TERAIO_GPU_PARTS="tests demo" bash scripts/gpu/run-torch.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/out}
mkdir -p "$out"
exec > >(tee "$out/run-torch.log") 2>&1
build=${TERAIO_BUILD_DIR:-build/gpu}
parts=${TERAIO_GPU_PARTS:-"tests demo llama safetensors"}
scratch=${TERAIO_SCRATCH:-/var/tmp/teraio}
mkdir -p "$scratch"
export CUFILE_LOGFILE_PATH=${CUFILE_LOGFILE_PATH:-$out/cufile.log}
python=$(command -v python3)
pypath=python
"$python" -c "import pytest" 2>/dev/null || pypath=python:.deps/pypath
status=0
step() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
fail() { echo "run-torch: FAILED: $*"; status=1; }
has() { [[ " $parts " == *" $1 "* ]]; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$python" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, sys.executable)"

step "configure and build (torch binding with CUDA)"
# The machine's default g++ is a wrapper whose builds carry their own copies of libstdc++'s
# stream symbols; inside a Python module loaded next to torch they crash on the first
# formatted number. The distribution's g++-13 links against the shared libstdc++ as it should.
compilers=()
if [ -x /usr/bin/g++-13 ]; then
  compilers=(-DCMAKE_C_COMPILER=/usr/bin/gcc-13 -DCMAKE_CXX_COMPILER=/usr/bin/g++-13 -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++-13)
fi
cmake -S . -B "$build" -G Ninja "${compilers[@]}" -DCMAKE_BUILD_TYPE=Release -DTERAIO_WITH_CUDA=ON -DTERAIO_WITH_TORCH=ON \
  -DTERAIO_BUILD_BENCHMARKS=OFF -DTERAIO_WERROR=OFF -DPython3_EXECUTABLE="$python" | tail -n 14 || { fail configure; exit 1; }
ninja -C "$build" -j "$(nproc)" teraio teraio_torch_native teraio_runtime_tests || { fail build; exit 1; }
# The module comes back with the results, so that a later run of the same sources can carry it.
cp python/teraio/_native*.so "$out/" 2>/dev/null || true

if has tests; then
  step "runtime C++ tests"
  "$build/tests/runtime/teraio_runtime_tests" --gtest_brief=1 || fail "runtime tests"
  step "Python tests (CPU and CUDA)"
  PYTHONPATH=$pypath "$python" -m pytest -q -p no:cacheprovider tests/python --junitxml="$out/pytest.xml" || fail "python tests"
fi
if has demo; then
  step "teraio demo --device cuda"
  PYTHONPATH=python "$python" -m teraio demo --device cuda --out "$scratch/demo" --ssd "$scratch/demo-swap" || fail demo
  cp "$scratch/demo/report.json" "$out/demo-report.json" 2>/dev/null || true
fi
if has llama; then
  step "transformers Llama: exactness under half the footprint, overhead when it fits"
  PYTHONPATH=python "$python" bench/train_llama.py --ssd "$scratch/llama-swap" --json "$out/llama.json" || fail llama
fi
if has safetensors; then
  step "safetensors loading benchmark"
  PYTHONPATH=python "$python" bench/load_safetensors.py --device cuda --dir "$scratch/st-bench" \
    --size "${TERAIO_ST_SIZE:-16GiB}" --repeat "${TERAIO_ST_REPEAT:-3}" --json "$out/load_safetensors.json" || fail safetensors
fi
step "done (status $status)"
exit $status
