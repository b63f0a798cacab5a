#!/usr/bin/env bash
# W3 calls on one GPU machine, from session 40 on (it began as session 40's call.sh; sessions
# 37-39's call.sh files are its earlier copies): W3 arms, each with its own output folder, the
# ideal, the copier tests and the exact suite's CUDA cases, all tarred into $OUT/call.tar (a call
# brings back at most 8 files). Sessions' records name arms, so an arm once added keeps its
# options: add arms, do not change them.
#   CALL_TAG=s40                      the work folders go under /var/tmp/$CALL_TAG (default w3)
#   RUNS="W3-c8:new W3-c8:shared ..."  the WORKLOAD:ARM pairs, in order (W3-cN: W3 with N of 32
#                                     recomputed, --save-trace, 3 measured steps; ARM new = the
#                                     defaults, share0 = --min-migration-share 0, alone =
#                                     --copy-order deadline-alone, hostwaits = nosync with
#                                     --copy-order deadline-host-waits). Session 38's calls 3-4 ran before a rename:
#                                     call 3's default then held the lane (today's alone), call 4's
#                                     arm "shared" (--copy-order deadline-shared) is today's default.
#                                     prof = the defaults with --gpu-profile (one more step under
#                                     torch.profiler, summarized in the run's log and JSON)
#                                     nosync = --host-syncs off (session 39: no host sync in each
#                                     micro-batch's forward, the same computation)
#                                     profnosync = both (session 39); chunked = nosync with
#                                     --copy-order deadline-chunked, nosyncalone = nosync with
#                                     --copy-order deadline-alone
#                                     profhostwaits = hostwaits with --gpu-profile (session 40)
#                                     hostwaitsin = nosync with --copy-order deadline-host-waits-in
#                                     profhostwaitsin = hostwaitsin with --gpu-profile (session 41)
#                                     freezein = hostwaitsin with --gc-freeze on, freezenosync = nosync
#                                     with --gc-freeze on (session 41; IDEAL_ARGS may add it too)
#                                     freezein2m, freezein4m = freezein with --copy-chunk 2MiB, 4MiB
#                                     (session 42: the lanes' pieces, against the mapping's cost)
#                                     freezeinrec = freezein with --paged-record on (the allocator's
#                                     requests of the measured steps, for teraio paged-replay here)
#                                     freezeinhold = freezein with --hold-copies on (session 43: the
#                                     allocator holds the copies back while it maps and unmaps)
#                                     freezeinholdhost = freezein with --hold-copies to-host (session 44:
#                                     only the copies out of the device, which make the calls dear)
#                                     proffreezeinhold = freezeinhold with --gpu-profile (session 45:
#                                     is the GPU time beyond the profile the GPU waiting for the host?)
#                                     freezedevhold = freezeinhold with --copy-order
#                                     deadline-device-waits-in (session 45: the GPU, not the host,
#                                     waits for copies in queued once their markers pass),
#                                     proffreezedevhold = freezedevhold with --gpu-profile
#   NOSIM=1                           device_stalls.py without the simulated step (saves 1-2 min a run)
#   IDEAL=1                           before the runs, measure W3's ideal here (2 and 4 layers,
#                                     checked at 3; about 100 s), for shares of a same-machine ideal
#   IDEAL_ARGS="--host-syncs off"     options added to the ideal's command (session 39)
#   COPIER=1                          first build and run the CUDA copier's C++ tests
#   EXACT=1                           then the exact suite's CUDA cases
#   STOP_ON_FAIL=1                    no runs when the copier or exact tests failed (session 45: a
#                                     copy order whose tests hang would hang its runs too)
#   PAGED=1                           then the paged allocator's tests (its CUDA cases in fresh
#                                     processes, the recording replayed by build/gpu's CLI; session 42)
#   VMM=1                             then bench/vmm_costs.py at 16 MiB pages: idle, with the GPU busy,
#                                     with 64 GiB mapped elsewhere, and both (session 41; about 40 s)
#   VMM=copying                       instead: idle, then with copies both ways in 8 MiB chunks whose
#                                     threads block, the same polling (as TeraIO's copier), and polling
#                                     copies of 2 and 32 MiB (session 42; about 60 s)
#   VMM=paused                        instead: idle, copies polling in 8 MiB chunks, the same paused for
#                                     the calls (--copy-pause), blocking and paused, 32 MiB paused
#                                     (session 43's call 5; about 35 s)
#   VMM=oneway                        instead: idle, copies both ways, into the device only, out only
#                                     (8 MiB, polling; about 30 s)
# Run from the repository root; carry .deps.
set -uo pipefail
start=$SECONDS
failed=""
out=${OUT:-$PWD/out}
work=/var/tmp/${CALL_TAG:-w3}/$(date +%s)  # one folder a call: names repeat from call to call
mkdir -p "$work" "$out"
. scripts/gpu/native-module.sh
. scripts/gpu/bench-arm.sh
ensure_native_module "$out"; echo "built ($((SECONDS - start)) s)"
if [ -n "${COPIER:-}" ]; then
  { ninja -C build/gpu -j "$(nproc)" teraio_io_cuda_tests >"$work/copier-build.log" 2>&1 &&
    timeout 240 build/gpu/tests/io/teraio_io_cuda_tests --gtest_filter='CudaCopier*'; } >"$work/copier.log" 2>&1
  status=$?; echo "copier tests: status $status ($((SECONDS - start)) s)"; [ "$status" = 0 ] || failed=1
  grep -E "order:|ready copy|PASSED|FAILED|OK \]" "$work/copier.log" | cut -c1-200
  tar -C "$work" -rf "$out/call.tar" copier.log copier-build.log
fi
if [ -n "${IDEAL:-}" ]; then
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 330 python3 bench/train_llm.py --workload W3 --budget 79GiB \
    --modes ideal --extrapolate 2,4,3 --warmup 1 --steps 3 --child-timeout 320 --out "$work/ideal" ${IDEAL_ARGS:-} \
    >"$work/ideal.log" 2>&1
  echo "W3 ideal: status $? ($((SECONDS - start)) s)"; grep -hE "^\| ideal|extrapolat" "$work/ideal"/W3-*.md | cut -c1-300
  cp "$work/ideal"/W3-*.md "$work/ideal.md" 2>/dev/null; xz -T0 -f "$work/ideal.log"
  tar -C "$work" -rf "$out/call.tar" ideal.md ideal.log.xz
fi
if [ -n "${EXACT:-}" ]; then
  PYTHONPATH=$(pytest_pythonpath) timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_training_exact.py tests/python/test_session_copy_order.py tests/python/test_session_host_syncs.py -k cuda >"$work/exact.log" 2>&1
  status=$?; echo "exact suite (cuda): status $status ($((SECONDS - start)) s)"; tail -n 5 "$work/exact.log"
  [ "$status" = 0 ] || failed=1
  tar -C "$work" -rf "$out/call.tar" exact.log
fi
if [ -n "${PAGED:-}" ]; then
  PYTHONPATH=$(pytest_pythonpath) timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_paged_allocator.py >"$work/paged.log" 2>&1
  echo "paged allocator tests: status $? ($((SECONDS - start)) s)"; tail -n 5 "$work/paged.log"
  tar -C "$work" -rf "$out/call.tar" paged.log
fi
if [ -n "${VMM:-}" ]; then
  # Whether W3's 183-220 µs a mapped page (session 41) is the H200's price, or the price while
  # kernels run or with the device mapped full: one table, a row per condition.
  conditions=("" "--busy" "--resident 64GiB" "--busy --resident 64GiB")
  # Whether the copy engines busy both ways, or the copier's threads polling the driver, make
  # W3's 120-210 µs a page (session 42: neither --busy nor --resident does).
  [ "$VMM" = copying ] && conditions=("" "--copying 8MiB --copy-wait block" "--copying 8MiB"
    "--copying 2MiB" "--copying 32MiB")
  # Whether holding the copies back and draining them first brings the calls to their idle price
  # (session 43: set access 37 µs a page paused against 908 beside copies).
  [ "$VMM" = paused ] && conditions=("" "--copying 8MiB" "--copying 8MiB --copy-pause"
    "--copying 8MiB --copy-wait block --copy-pause" "--copying 32MiB --copy-pause")
  # Whether copies one way only make the calls dear (then the allocator need hold only that lane).
  [ "$VMM" = oneway ] && conditions=("" "--copying 8MiB" "--copying 8MiB --copy-ways in"
    "--copying 8MiB --copy-ways out")
  for condition in "${conditions[@]}"; do
    # shellcheck disable=SC2086  # the condition is a list of options
    timeout 120 python3 bench/vmm_costs.py --total 4GiB --pages 16MiB $condition 2>&1 |
      { if [ -z "$condition" ]; then cat; else tail -n 1; fi; }
  done >"$work/vmm.md"
  echo "vmm costs ($((SECONDS - start)) s)"; cat "$work/vmm.md"
  tar -C "$work" -rf "$out/call.tar" vmm.md
fi
if [ -n "${STOP_ON_FAIL:-}" ] && [ -n "${failed:-}" ]; then
  echo "STOP_ON_FAIL: tests failed, the runs ($RUNS) skipped"; RUNS=""
fi
i=0
for run in ${RUNS:-}; do
  i=$((i + 1)); name=$i-${run/:/-}
  mkdir -p "$work/$name"
  workload=${run%%:*}
  case ${run##*:} in
    share0) extra=(--min-migration-share 0) ;;
    alone) extra=(--copy-order deadline-alone) ;;
    prof) extra=(--gpu-profile) ;;
    nosync) extra=(--host-syncs off) ;;
    profnosync) extra=(--gpu-profile --host-syncs off) ;;
    chunked) extra=(--host-syncs off --copy-order deadline-chunked) ;;
    nosyncalone) extra=(--host-syncs off --copy-order deadline-alone) ;;
    hostwaits) extra=(--host-syncs off --copy-order deadline-host-waits) ;;
    profhostwaits) extra=(--gpu-profile --host-syncs off --copy-order deadline-host-waits) ;;
    hostwaitsin) extra=(--host-syncs off --copy-order deadline-host-waits-in) ;;
    profhostwaitsin) extra=(--gpu-profile --host-syncs off --copy-order deadline-host-waits-in) ;;
    freezein) extra=(--host-syncs off --copy-order deadline-host-waits-in --gc-freeze on) ;;
    freezenosync) extra=(--host-syncs off --gc-freeze on) ;;
    freezein2m) extra=(--host-syncs off --copy-order deadline-host-waits-in --gc-freeze on --copy-chunk 2MiB) ;;
    freezein4m) extra=(--host-syncs off --copy-order deadline-host-waits-in --gc-freeze on --copy-chunk 4MiB) ;;
    freezeinrec) extra=(--host-syncs off --copy-order deadline-host-waits-in --gc-freeze on --paged-record on) ;;
    freezeinhold) extra=(--host-syncs off --copy-order deadline-host-waits-in --gc-freeze on --hold-copies on) ;;
    freezeinholdhost) extra=(--host-syncs off --copy-order deadline-host-waits-in --gc-freeze on --hold-copies to-host) ;;
    proffreezeinhold) extra=(--gpu-profile --host-syncs off --copy-order deadline-host-waits-in --gc-freeze on --hold-copies on) ;;
    freezedevhold) extra=(--host-syncs off --copy-order deadline-device-waits-in --gc-freeze on --hold-copies on) ;;
    proffreezedevhold) extra=(--gpu-profile --host-syncs off --copy-order deadline-device-waits-in --gc-freeze on --hold-copies on) ;;
    *) extra=() ;;
  esac
  LEFT=$((590 - (SECONDS - start))) bench_arm "$work/$name" "$name" W3-79GiB --workload W3 --budget 79GiB \
    --modes teraio-recompute --recompute-counts "${workload#W3-c}" --recompute-measure 0 --warmup 1 --steps 3 \
    --reserve 5GiB --host-budget 100GiB --allocator paged --paged-page 16MiB --save-trace "${extra[@]}"
  # the trace, plan and device waits, for teraio simulate and bench/device_stalls.py here
  runs=$(cd /var/tmp/teraio && ls -dt "$name"-*/ | head -n 1)  # this call's run of that name
  XZ_OPT="-T0 -3" tar -C /var/tmp/teraio -cJf "$work/$name/saved.tar.xz" $(cd /var/tmp/teraio && ls -d "$runs"*trace* \
    "$runs"*plan* "$runs"*device-waits* "$runs"*paged-requests* 2>/dev/null)
  # the last measured step's device waits by where their copies stood and by the size due; with
  # the teraio CLI that run-torch.sh builds beside the module, against the simulated step too
  # (per stretch, and the GPU time between the waits against the profile's operator times)
  saved=/var/tmp/teraio/${runs}W3-79GiB-teraio-recompute
  simulation=()
  [ -x build/gpu/tools/teraio/teraio ] && [ -z "${NOSIM:-}" ] &&
    simulation=(--teraio build/gpu/tools/teraio/teraio --trace "$saved-trace.tiotrace" --budget 74GiB)
  python3 bench/device_stalls.py "$saved-device-waits.json" --plan "$saved-plan.json" "${simulation[@]}" |
    tee "$work/$name/stalls.txt"
  tar -C "$work" -rf "$out/call.tar" "$name"
  echo "after $name: $((SECONDS - start)) s"
done
