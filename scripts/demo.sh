#!/usr/bin/env bash
# The main job, for now: installs what TeraIO needs, builds it, shows what this machine offers
# (`teraio doctor`) and measures the storage engine against raw O_DIRECT on a temporary
# directory (`teraio iobench`, about a minute). Works on a fresh Debian 12 machine.
#   bash scripts/demo.sh
#   TERAIO_DEMO_VOLUME=2GiB TERAIO_DEMO_PATHS=/mnt/a,/mnt/b bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
volume=${TERAIO_DEMO_VOLUME:-512MiB}
paths=${TERAIO_DEMO_PATHS:-}

step() { printf '\n=== %s\n' "$*"; }

step "dependencies"
bash scripts/install-deps.sh

step "build (build/release)"
# The same configuration as scripts/test.sh, so that the two commands share one build.
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
ninja -C build/release -j "$(nproc)" teraio
teraio=build/release/tools/teraio/teraio

step "teraio doctor"
if [ -n "$paths" ]; then
  "$teraio" doctor --paths "$paths"
else
  "$teraio" doctor
fi

step "teraio iobench --volume $volume${paths:+ --paths $paths}"
args=(--volume "$volume" --json build/release/iobench.json)
[ -n "$paths" ] && args+=(--paths "$paths")
"$teraio" iobench "${args[@]}"
echo
echo "demo: done (results also in build/release/iobench.json)"
