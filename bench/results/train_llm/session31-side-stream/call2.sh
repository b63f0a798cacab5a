#!/usr/bin/env bash
# Session 31, call 2 (warm machine from call 1, build-wt/side's module built there): W3 16 of 32 on
# the side-stream branch; then build the timer-slack branch's module (build-wt/slack) for call 3.
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; runs=/var/tmp/teraio/s31; root=$PWD
ls build-wt/side/python/teraio/_native*.so || exit 1
cd build-wt/side
PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 400 python3 bench/train_llm.py --workload W3 --budget 79GiB \
  --modes teraio-recompute --recompute-counts 16 --recompute-measure 0 --warmup 1 --steps 1 --reserve 5GiB \
  --host-budget 100GiB --allocator paged --paged-page 16MiB --child-timeout 395 \
  --out "$runs/side-c16" >"$out/w3-c16-side.log" 2>&1
echo "W3 side: status $? ($((SECONDS - start)) s)"; grep -E "planned with|step .*(measured|warm-up)" "$out/w3-c16-side.log" | cut -c1-400
grep -E "PCIe link" "$out/w3-c16-side.log"
cp "$runs"/side-c16/W3-79GiB.md "$out/side-c16-W3-79GiB.md" 2>/dev/null; cp "$runs"/side-c16/W3-79GiB.json "$out/side-c16-W3-79GiB.json" 2>/dev/null
cd "$root"
if [ -d build-wt/slack ]; then
  ln -sfn ../../.deps build-wt/slack/.deps
  (cd build-wt/slack && mkdir -p /tmp/slack-out && OUT=/tmp/slack-out TERAIO_GPU_PARTS=none bash scripts/gpu/run-torch.sh >/tmp/slack-out/build.log 2>&1; echo "slack module: status $?")
  ls build-wt/slack/python/teraio/_native*.so
fi
echo "total $((SECONDS - start)) s"
