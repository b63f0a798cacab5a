#!/usr/bin/env bash
# Session 35, offline (CPU): plans made with and without the profile's recorded releases, and
# with lead 3 and 100, each simulated on the trace as recorded under the runtime's budget
# (`--enforce-budget`: over the budget the simulator evicts and fetches on demand, as the runtime
# does). Three traces profiled with --release-tracking on. Run from the repository root after
# building (build/release). Prints one line per plan.
set -euo pipefail
T=${TERAIO:-build/release/tools/teraio/teraio}
R=bench/results/train_llm
work=${WORK:-/tmp/offline35}; mkdir -p "$work"
xz -dc $R/session12-kept-copies/w2-16-ab/W2-16GiB-on-trace.tiotrace.xz >"$work/w2-16.tiotrace"
xz -dc $R/session7-next-use/before/W2-24GiB-host-on-trace.tiotrace.xz >"$work/w2-24.tiotrace"
tar xJf $R/session31-side-stream/call6/c1-rel-saved.tar.xz -C "$work" W3-79GiB-teraio-recompute-trace.tiotrace
mv "$work/W3-79GiB-teraio-recompute-trace.tiotrace" "$work/w3-c1.tiotrace"
# name, plan budget (the runtime's budget less the plan margin), host tier, rates, runtime budget
cases=("w2-16 14965276672 48GiB 51.8GB/s 50.25GB/s 14GiB"
       "w2-24 23488102400 40GiB 51.8GB/s 50.25GB/s 22GiB"
       "w3-c1 79389786112 100GiB 49.22GB/s 49.27GB/s 74GiB")
for c in "${cases[@]}"; do
  read -r name budget host d2h h2d runtime <<<"$c"
  for releases in recorded last-use; do
    for lead in 3 100; do
      p="$work/$name-$releases-$lead.json"
      "$T" plan "$work/$name.tiotrace" --budget "$budget" --host-capacity "$host" --d2h "$d2h" --h2d "$h2d" \
        --early-prefetch-lead "$lead" --releases "$releases" -o "$p" >/dev/null || true  # 3: no plan fits
      sim=$("$T" simulate "$work/$name.tiotrace" "$p" --enforce-budget --budget "$runtime")
      echo "$name planned with releases $releases, lead $lead: $(grep -E '^(step time|evictions)' <<<"$sim" |
        sed -E 's/ +/ /g; s/ \(step 2 of 2\)//; s/ to keep the budget//' | tr '\n' ';')"
    done
  done
done
