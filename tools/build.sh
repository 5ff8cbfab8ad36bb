#!/usr/bin/env bash
# Configures and builds tprun into $TPRUN_BUILD_DIR (default build/).
#   tools/build.sh [TARGET ...]   ninja targets (default: all), e.g. tools/build.sh tprun
# TPRUN_JOBS: parallel jobs (default: every core); TPRUN_BUILD_TYPE: CMake's build type on the
# first configure (default RelWithDebInfo; the configure log goes to $TPRUN_BUILD_DIR.configure.log).
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TPRUN_BUILD_DIR:-$root/build}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${TPRUN_BUILD_TYPE:-RelWithDebInfo} >"$build.configure.log" 2>&1 \
    || { cat "$build.configure.log"; exit 1; }
fi
ninja -C "$build" -j "${TPRUN_JOBS:-$(nproc)}" "$@"
