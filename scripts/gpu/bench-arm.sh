# shellcheck shell=bash
# Sourced by the per-session GPU call scripts (bench/results/train_llm/*/next-call.sh), from the
# repository root: one bench/train_llm.py run of a named arm, summarized for the call's output.
# bench_arm OUT NAME FILE ARGS... runs the bench with ARGS (at TERAIO_LOG_LEVEL, debug unless
# set), inside LEFT seconds (default 570: a call's 600 less the build's margin), with its --out
# under /var/tmp/teraio. It prints the status, the table's TeraIO rows and the measured steps'
# lines, and leaves NAME.md and NAME.json (the bench's FILE.md and FILE.json) and NAME.log.xz in
# OUT. PYTHON picks the interpreter (default python3).
bench_arm() {
  local out=$1 name=$2 file=$3
  shift 3
  local start=$SECONDS left=${LEFT:-570} runs=/var/tmp/teraio/$name-$SECONDS status
  TERAIO_LOG_LEVEL=${TERAIO_LOG_LEVEL:-debug} PYTHONUNBUFFERED=1 PYTHONPATH=python timeout "$left" \
    "${PYTHON:-python3}" bench/train_llm.py "$@" --child-timeout "$((left - 5))" --out "$runs" >"$out/$name.log" 2>&1
  status=$?
  echo "$name: status $status ($((SECONDS - start)) s)"
  grep -E "^\| teraio" "$runs/$file.md"
  grep -E "step .*measured" "$out/$name.log" | sed -E 's/ callbacks.*link:/ link:/' | cut -c1-300
  cp "$runs/$file.md" "$out/$name.md"
  cp "$runs/$file.json" "$out/$name.json"
  xz -T0 -f "$out/$name.log"
  return "$status"
}
