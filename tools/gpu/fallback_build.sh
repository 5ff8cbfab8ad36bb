#!/usr/bin/env bash
# Builds tprun and tprun_mpi_tests on a GPU host from a bundle's carried sources (src/) and "-dev
# packages" (dev/, tools/gpu/pack_dev.sh), against the host's own torch, when the prebuilt binaries
# cannot start there (run.sh calls this). Needs CMake, ninja, a C++17 compiler and nvcc (CUDA's
# headers); says which is missing. The results replace WORK/bin/.
# usage: fallback_build.sh WORK      (TPRUN_GPU_PYTHON: the python with torch, default python3)
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
work=$(cd "$1" && pwd)
py=${TPRUN_GPU_PYTHON:-python3}
src=$work/src dev=$work/dev b=$work/build-host arch=x86_64-linux-gnu
missing=()
for t in cmake c++; do command -v $t >/dev/null || missing+=("$t"); done
ninja=$(command -v ninja || true)
[ -n "$ninja" ] || ninja=$("$py" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || true)
[ -n "$ninja" ] || missing+=(ninja)
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || missing+=(nvcc)
[ ${#missing[@]} -eq 0 ] || { echo "fallback build: this host lacks ${missing[*]}"; exit 1; }
export PATH=$dev/bin:$work/mpi/bin:/usr/local/cuda/bin:$PATH
export PKG_CONFIG_SYSROOT_DIR=$dev PKG_CONFIG_LIBDIR=$dev/usr/lib/$arch/pkgconfig:$dev/usr/share/pkgconfig
torch_prefix=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
echo "fallback build: $(c++ --version | head -n 1); $(cmake --version | head -n 1); torch from $torch_prefix"
TPRUN_VENV=/nonexistent cmake -S "$src" -B "$b" -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR="$torch_prefix/Torch" -DTPRUN_DEV_ROOT="$dev" \
  -DTPRUN_MPI_INCLUDE_DIR="$dev/usr/lib/$arch/openmpi/include" -DTPRUN_MPI_LIBRARY="$work/lib/libmpi.so.40" \
  -DCMAKE_BUILD_RPATH="$work/lib"
# TPRUN_FALLBACK_TARGETS: other ninja targets (a rehearsal that stops short of the full build).
targets=${TPRUN_FALLBACK_TARGETS:-tprun tprun_mpi_tests}
"$ninja" -C "$b" -j "$(nproc)" $targets
[ -n "${TPRUN_FALLBACK_TARGETS:-}" ] && { echo "fallback build: built $targets"; exit 0; }
cp "$b/bin/tprun" "$b/tests/tprun_mpi_tests" "$work/bin/"
echo "fallback build: done; $work/bin/ holds binaries built on this host"
