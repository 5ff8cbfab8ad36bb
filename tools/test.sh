#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test.
#   tools/test.sh            all tests (unit, multi-rank at 1/2/4 ranks, CLI and failure cases)
#   tools/test.sh -L mpi     only multi-rank tests (any ctest arguments work)
#   tools/test.sh -L gpu     CUDA/NCCL tests (skipped where no GPU is visible)
#   tools/test.sh --help     this text (ctest's own options: ctest --help)
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh"
"$root/tools/build.sh"
cd "${TPRUN_BUILD_DIR:-$root/build}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec ctest --output-on-failure --timeout 900 "$@"
