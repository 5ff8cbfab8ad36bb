#!/usr/bin/env bash
# Configures and builds tprun into $TPRUN_BUILD_DIR (default build/).
# Extra arguments are ninja targets (default: all).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TPRUN_BUILD_DIR:-$root/build}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${TPRUN_BUILD_TYPE:-RelWithDebInfo} >"$build.configure.log" 2>&1 \
    || { cat "$build.configure.log"; exit 1; }
fi
ninja -C "$build" -j "${TPRUN_JOBS:-$(nproc)}" "$@"
