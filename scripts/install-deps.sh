#!/usr/bin/env bash
# Installs the Debian 12 packages TeraIO needs to build, test and run its demo.
# Idempotent: packages already present are skipped, so CI and repeated runs stay fast.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang clang-format libclang-rt-14-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  nlohmann-json3-dev libxxhash-dev liburing-dev pybind11-dev
  python3 python3-dev python3-pytest python3-numpy python3-matplotlib python3-tqdm
  python3-torch libtorch-dev python3-venv python3-pip python3-setuptools
  fio xz-utils
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
