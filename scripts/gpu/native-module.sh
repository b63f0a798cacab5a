# shellcheck shell=bash
# Sourced by the GPU scripts that run Python against teraio._native, from the repository root.
# ensure_native_module OUT builds the module with run-torch.sh unless one is already
# in python/teraio (carried from an earlier run of the same sources) or TERAIO_REBUILD is set;
# pytest_pythonpath is PYTHONPATH for pytest, which the machine's interpreter may lack
# (.deps/pypath, staged by stage-deps.sh).
ensure_native_module() {
  local out=$1
  if [ -n "${TERAIO_REBUILD:-}" ] || ! ls python/teraio/_native*.so >/dev/null 2>&1; then
    TERAIO_GPU_PARTS=none bash scripts/gpu/run-torch.sh >"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
  fi
}

pytest_pythonpath() {
  if python3 -c "import pytest" 2>/dev/null; then echo python; else echo python:.deps/pypath; fi
}
