#!/usr/bin/env bash
# Prepared in session 34 for the next session: the phantom-room fix (commit d1ab0d0) against the
# module of the sources before it, on one machine, one run per call (W3 ~300 s, W2 ~100 s).
#   MODULE=new|old  new: this checkout's module (built here if missing); old: session 34's
#                   module from before the fix, .deps/native-810ce10 (built on the GPU machine;
#                   the Python files are the same), run from a scratch copy of python/
#   ARM=default|lead100|slack-kernel|slack-10us   WORKLOAD=W3|W2   (W3: 16 of 32 recomputed; W2: 16 GiB, 8 of 8)
#   slack-kernel: TERAIO_POLL_SLACK=kernel, the polling threads' timer slack as before session 34's
#   change (the kernel's 50 us); the copier line of the engine report says which ran
# Writes 3 files under $OUT (the tool brings back at most 8).
set -uo pipefail
start=$SECONDS
out=${OUT:-$PWD/out}; module=${MODULE:-new}; arm=${ARM:-default}; workload=${WORKLOAD:-W3}
. scripts/gpu/native-module.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
pypath=python
if [ "$module" = old ]; then
  pypath=/var/tmp/teraio/oldpy; rm -rf "$pypath"; mkdir -p "$pypath"; cp -r python/teraio "$pypath/"
  rm -f "$pypath"/teraio/_native*.so; cp .deps/native-810ce10/_native*.so "$pypath/teraio/" || exit 1
fi
PYTHONPATH=$pypath python3 -c "import teraio._native as n; print('module:', n.__file__)" || exit 1
extra=(); [ "$arm" = lead100 ] && extra=(--early-prefetch-lead 100)
slack=${TERAIO_POLL_SLACK:-}; [ "$arm" = slack-kernel ] && slack=kernel; [ "$arm" = slack-10us ] && slack=10us
name=$workload-$module-$arm; runs=/var/tmp/teraio/next-$name
if [ "$workload" = W3 ]; then
  args=(--workload W3 --budget 79GiB --modes teraio-recompute --recompute-counts 16 --recompute-measure 0 --warmup 1
        --steps 3 --reserve 5GiB --host-budget 100GiB --allocator paged --paged-page 16MiB); file=W3-79GiB
else
  args=(--workload W2 --budget 16GiB --modes teraio-recompute --recompute-counts 8 --recompute-measure 0 --warmup 1
        --steps 3 --host-budget 48GiB --allocator paged); file=W2-16GiB
fi
left=$((570 - (SECONDS - start)))
TERAIO_POLL_SLACK=$slack TERAIO_LOG_LEVEL=debug PYTHONUNBUFFERED=1 PYTHONPATH=$pypath timeout "$left" python3 bench/train_llm.py "${args[@]}" \
  "${extra[@]}" --child-timeout "$((left - 5))" --out "$runs" >"$out/$name.log" 2>&1
echo "$name: status $? ($((SECONDS - start)) s)"; grep -E "^\| teraio" "$runs/$file.md"
echo "evictions: $(grep -c 'evict tensor' "$out/$name.log"), demand fetches: $(grep -c 'demand fetch' "$out/$name.log") (all steps)"
grep -oE "copier [^,]*|watchers poll with [^)]*" "$runs/$file.json" | sort -u | head -2
grep -E "step .*measured" "$out/$name.log" | sed -E 's/ callbacks.*link:/ link:/' | cut -c1-300
cp "$runs/$file.md" "$out/$name.md"; cp "$runs/$file.json" "$out/$name.json"; xz -T0 "$out/$name.log"
echo "total $((SECONDS - start)) s"
