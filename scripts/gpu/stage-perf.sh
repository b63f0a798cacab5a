#!/usr/bin/env bash
# Stages Debian's perf (linux-perf) with the libraries a GPU machine lacks, packed as
# .deps/perf.tar.xz (ignored by git; about 6 MB, so it fits the device tool's carry limit where
# the unpacked 24 MB does not), for a CPU profile of the training threads there: the GPU
# machines have no package registry and no perf. On the GPU machine (carry .deps/perf.tar.xz):
#   mkdir -p /tmp/perf && tar -xJf .deps/perf.tar.xz -C /tmp/perf
#   /tmp/perf/run record -F 499 -g -p PID -o perf.data -- sleep 20
#   /tmp/perf/run report -i perf.data --stdio --no-children
# `run` calls the staged binary with the staged libraries.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.deps/perf
rm -rf "$dest" && mkdir -p "$dest/debs"
(cd "$dest/debs" && apt-get download linux-perf libbabeltrace1 libdw1 libelf1 libnuma1 libopencsd1 \
  libperl5.36 libpython3.11 libslang2 libunwind8 libcap2 >/dev/null)
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest/root"; done
# Perl's module tree and the docs: perf needs only the shared libraries to start.
rm -rf "$dest/debs" "$dest/root/usr/share" "$dest/root/usr/lib/x86_64-linux-gnu/perl"
cat > "$dest/run" <<RUN
#!/usr/bin/env bash
here=\$(cd "\$(dirname "\$0")" && pwd)
LD_LIBRARY_PATH="\$here/root/usr/lib/x86_64-linux-gnu:\$here/root/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "\$here/root/usr/bin/perf" "\$@"
RUN
chmod +x "$dest/run"
# Libraries a minimal image may lack (libbabeltrace needs GLib), copied from this machine; the C
# and C++ runtimes stay the target's own (newer there).
for lib in libglib-2.0.so.0 libpcre2-8.so.0 libuuid.so.1 libexpat.so.1 libcrypt.so.1 libbz2.so.1.0 \
  liblzma.so.5 libzstd.so.1 libz.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$dest/root/usr/lib/x86_64-linux-gnu/"
done
"$dest/run" --version
tar -cJf .deps/perf.tar.xz -C "$dest" run root
rm -rf "$dest"
du -sh .deps/perf.tar.xz
