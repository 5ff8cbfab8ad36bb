#!/usr/bin/env bash
# Rehearses the GPU bundle's fallback build here (docs/gpu.md, "The fallback build"): unpacks
# build/gpu-bundle/payload.tar.xz, hides the Debian development files tprun builds with (library
# headers, CMake and pkg-config files, mpicc/mpirun, pkg-config) in a private mount namespace, and
# runs tools/gpu/fallback_build.sh as run.sh would on a GPU host, with env -i. By default it configures
# and compiles one object of each layer that includes a bundled library's headers (about a minute on 2
# cores); --full builds tprun and tprun_mpi_tests and runs `tprun --version` (a full build).
# Needs root or user namespaces (`unshare -m`).
#   usage: tools/gpu/rehearse_fallback.sh [--full]
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TPRUN_BUILD_DIR:-$root/build}
py=${TPRUN_VENV:-$HOME/.cache/tprun/venv}/bin/python
targets="src/CMakeFiles/tprun_runtime.dir/runtime/error.cpp.o src/CMakeFiles/tprun_cli.dir/cli/cli.cpp.o
src/CMakeFiles/tprun_text.dir/text/hf_regex.cpp.o src/CMakeFiles/tprun_checkpoint.dir/checkpoint/hdf5_util.cpp.o
src/CMakeFiles/tprun_pipelines.dir/pipelines/png_image.cpp.o src/CMakeFiles/tprun_dist.dir/dist/mpi_world.cpp.o
src/CMakeFiles/tprun_memory.dir/memory/group_offloader.cpp.o"
[ "${1:-}" = "--full" ] && targets=""
work=$build/gpu-fallback-rehearsal
rm -rf "$work" && mkdir -p "$work"
tar -xJf "$build/gpu-bundle/payload.tar.xz" -C "$work"
hide_dirs="/usr/include/boost /usr/include/spdlog /usr/include/fmt /usr/include/nlohmann /usr/include/toml++
/usr/include/hdf5 /usr/include/unicode /usr/include/re2 /usr/include/gtest /usr/include/gmock /usr/include/libpng16
/usr/lib/x86_64-linux-gnu/cmake /usr/lib/x86_64-linux-gnu/pkgconfig /usr/share/pkgconfig /usr/share/cmake
/usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/hdf5 /usr/lib/x86_64-linux-gnu/pmix2"
hide_files="/usr/include/png.h /usr/include/xxhash.h /usr/include/zlib.h /usr/include/sentencepiece_processor.h
/usr/include/sentencepiece_trainer.h /usr/bin/pkg-config /usr/bin/pkgconf /usr/bin/mpicc /usr/bin/mpirun"
inner='set -e
for d in '"$(echo $hide_dirs)"'; do [ -d "$d" ] && mount -t tmpfs none "$d"; done
for f in '"$(echo $hide_files)"'; do [ -e "$f" ] && mount --bind /dev/null "$f"; done
exec env -i PATH=/usr/bin:/bin HOME="'"$HOME"'" TPRUN_GPU_PYTHON="'"$py"'" TPRUN_FALLBACK_TARGETS="'"$(echo $targets)"'" \
  bash "'"$work"'/src/tools/gpu/fallback_build.sh" "'"$work"'"'
unshare -m --propagation private bash -c "$inner"
if [ -z "$targets" ]; then
  . "$root/tools/gpu/bundle_env.sh"
  bundle_env "$work" "$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
  "$work/bin/tprun" --version
fi
echo "rehearse_fallback: OK"
