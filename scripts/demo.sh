#!/usr/bin/env bash
# The main job: installs what TeraIO needs, builds it, and trains a small GPT under a memory
# budget of 40% of its footprint, offloading to a local directory, then checks every loss and
# parameter bit for bit against the same training without TeraIO (`teraio demo`).
# Works on a fresh Debian 12 machine.
#   bash scripts/demo.sh                         on the CPU (a few minutes)
#   bash scripts/demo.sh --device cuda           on a GPU, a larger GPT (needs a CUDA torch in /usr/bin/python3;
#                                                the GPU machine runs scripts/gpu/run-torch.sh instead)
#   bash scripts/demo.sh --steps 50 --budget-fraction 0.3 --ssd /mnt/nvme/teraio
# Every argument goes to `teraio demo` (see `build/release/tools/teraio/teraio demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*"; }

step "dependencies"
bash scripts/install-deps.sh

step "build (build/release)"
# The same configuration as scripts/test.sh, so that the two commands share one build.
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
if ! ninja -C build/release -t targets all | grep -q '^teraio_torch_native:'; then
  echo "demo: the PyTorch binding is not configured (see: cmake -S . -B build/release); it needs torch and its C++ headers" >&2
  exit 1
fi
ninja -C build/release -j "$(nproc)" teraio teraio_torch_native

step "teraio demo $*"
exec build/release/tools/teraio/teraio demo "$@"
