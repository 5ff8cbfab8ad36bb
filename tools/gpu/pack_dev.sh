#!/usr/bin/env bash
# The "-dev packages" of a GPU bundle (tools/gpu-bundle.sh): what a build on a host without tprun's
# Debian libraries needs besides the bundle's lib/ (tools/gpu/fallback_build.sh uses it):
#   DEST/usr/include/...      the library headers the build here actually used (ninja's deps log),
#                             not the C library's or the compiler's, which every build host has
#   DEST/usr/lib/.../cmake    the CMake package files (fmt, spdlog, Boost, GTest, toml++, nlohmann)
#   DEST/usr/lib/.../pkgconfig and pkgconf: the .pc files, read with PKG_CONFIG_SYSROOT_DIR=DEST
#   DEST/usr/lib/...          the link-time names (libfmt.so, libhdf5_openmpi.so, ...) as relative
#                             links to the bundle's lib/ copies; GoogleTest's static libraries
# usage: pack_dev.sh BUILD_DIR DEST   (DEST beside the bundle's lib/: PAYLOAD/dev)
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
build=$1 dest=$2
mkdir -p "$dest/usr" "$dest/bin"
arch=x86_64-linux-gnu
# build/sysinc/{fmt,spdlog} are links to the system's folders (cmake/dependencies.cmake).
sysinc=$(cd "$build" && pwd)/sysinc/
ninja -C "$build" -t deps 2>/dev/null | awk '/^    \//{print $1}' | sed "s|^$sysinc|/usr/include/|" | sort -u >"$dest/.deps"
dpkg -L libc6-dev linux-libc-dev libstdc++-12-dev libgcc-12-dev libcrypt-dev 2>/dev/null | sort -u >"$dest/.system" || true
grep -E "^(/usr/include/|/usr/lib/$arch/openmpi/include/)" "$dest/.deps" | grep -v '^/usr/include/c++/' \
  | comm -23 - "$dest/.system" >"$dest/.headers"
for h in /usr/include/zlib.h /usr/include/zconf.h; do [ -f "$h" ] && echo "$h" >>"$dest/.headers"; done
tar -chf - -T "$dest/.headers" 2>/dev/null | tar -xf - -C "$dest"
# Headers that include others by relative path from folders the deps log does not list in full
# (Boost's preprocessor iterations) are covered: the log names every file the compiler opened.
rm -f "$dest/.deps" "$dest/.system" "$dest/.headers"
# Every include folder the .pc files name must exist (CMake refuses an imported target otherwise).
for d in $(pkg-config --cflags-only-I hdf5-openmpi sentencepiece icu-uc icu-i18n re2 libxxhash tomlplusplus 2>/dev/null); do
  mkdir -p "$dest${d#-I}"
done
for d in fmt spdlog Boost-1.74.0 boost_headers-1.74.0 boost_program_options-1.74.0 BoostDetectToolset-1.74.0.cmake GTest tomlplusplus; do
  [ -e "/usr/lib/$arch/cmake/$d" ] && mkdir -p "$dest/usr/lib/$arch/cmake" && cp -r "/usr/lib/$arch/cmake/$d" "$dest/usr/lib/$arch/cmake/"
done
for d in /usr/share/cmake/nlohmann_json /usr/lib/cmake/nlohmann_json /usr/share/cmake/tomlplusplus; do
  [ -d "$d" ] && mkdir -p "$dest$(dirname "$d")" && cp -r "$d" "$dest$(dirname "$d")/"
done
mkdir -p "$dest/usr/lib/$arch/pkgconfig" "$dest/usr/share/pkgconfig"
cp /usr/lib/$arch/pkgconfig/*.pc "$dest/usr/lib/$arch/pkgconfig/" 2>/dev/null || true
cp /usr/share/pkgconfig/*.pc "$dest/usr/share/pkgconfig/" 2>/dev/null || true
cp /usr/lib/$arch/libgtest*.a /usr/lib/$arch/libgmock*.a "$dest/usr/lib/$arch/" 2>/dev/null || true
# pkgconf, with its library, for hosts without pkg-config.
if command -v pkgconf >/dev/null; then
  cp "$(readlink -f "$(command -v pkgconf)")" "$dest/bin/pkgconf.bin"
  lib=$(ldd "$(command -v pkgconf)" | awk '/libpkgconf/{print $3}')
  [ -n "$lib" ] && cp -L "$lib" "$dest/bin/"
  printf '#!/bin/sh\nd=$(dirname "$0")\nLD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/pkgconf.bin" "$@"\n' >"$dest/bin/pkg-config"
  chmod +x "$dest/bin/pkg-config"
fi
# Link-time names -> the bundle's copies (../lib beside dev/).
python3 - "$dest" "$(dirname "$dest")/lib" "$arch" <<'PY'
import os, sys
dest, lib, arch = sys.argv[1:4]
bundled = {os.path.realpath(f"/usr/lib/{arch}/{n}"): n for n in os.listdir(lib) if os.path.exists(f"/usr/lib/{arch}/{n}")}
# Libraries found elsewhere (hdf5/openmpi, openmpi/lib): by soname.
for root, dirs, files in os.walk(f"/usr/lib/{arch}"):
    if root.count("/") - f"/usr/lib/{arch}".count("/") > 2:
        dirs[:] = []
        continue
    for n in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
        if n in os.listdir(lib):
            bundled.setdefault(os.path.realpath(os.path.join(root, n)), n)
made = 0
for root, dirs, files in os.walk(f"/usr/lib/{arch}"):
    if root.count("/") - f"/usr/lib/{arch}".count("/") > 2:
        dirs[:] = []
        continue
    for n in files:
        if not n.startswith("lib") or ".so" not in n:
            continue
        real = os.path.realpath(os.path.join(root, n))
        if real not in bundled:
            continue
        link = os.path.join(dest, root.lstrip("/"), n)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(os.path.relpath(os.path.join(lib, bundled[real]), os.path.dirname(link)), link)
            made += 1
print(f"pack_dev: {made} link-time names")
PY
