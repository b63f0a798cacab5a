#!/usr/bin/env bash
# Stages copies of Debian's build dependencies in .deps/ (ignored by git) so that a machine
# without a package registry and without these -dev packages (the GPU machines) can build
# TeraIO: carry .deps with the working tree. Run here, after scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deps/nlohmann/include .deps/xxhash/include
cp -r /usr/include/nlohmann .deps/nlohmann/include/
cp /usr/include/xxhash.h /usr/include/xxh3.h .deps/xxhash/include/
rm -rf .deps/googletest && cp -r /usr/src/googletest .deps/googletest
if [ ! -f .deps/liburing/usr/include/liburing.h ]; then
  (mkdir -p .deps/debs && cd .deps/debs && apt-get download liburing-dev liburing2 >/dev/null)
  for deb in .deps/debs/liburing*.deb; do dpkg -x "$deb" .deps/liburing; done
fi
# Debian's pytest (pure Python) for machines whose Python has none: used only when the
# machine's own interpreter cannot import pytest (scripts/gpu/run-torch.sh).
mkdir -p .deps/pypath
for pkg in pytest _pytest pluggy iniconfig py py.py packaging; do
  rm -rf ".deps/pypath/$pkg" && cp -r "/usr/lib/python3/dist-packages/$pkg" .deps/pypath/
done
du -sh .deps
