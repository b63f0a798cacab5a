#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
date -u
TERAIO_GPU_PARTS=none bash scripts/gpu/run-torch.sh > $OUT/build.log 2>&1 || { tail -n 40 $OUT/build.log; exit 1; }
pypath=python; python3 -c "import pytest" 2>/dev/null || pypath=python:.deps/pypath
PYTHONPATH=$pypath python3 -m pytest -q -p no:cacheprovider tests/python/test_session_reuse_blocks.py 2>&1 | tee $OUT/pytest-reuse.log
date -u
bash .deps/s23/w3.sh w3-reuse --reuse-blocks on
date -u
