#!/usr/bin/env bash
# The main job. For now: four ranks, TP groups of two, each rank's view of the
# mesh. (Later issues turn this into a real generation job.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh"
"$root/tools/build.sh" tprun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -np 4 --oversubscribe "${TPRUN_BUILD_DIR:-$root/build}/bin/tprun" env --tp 2 --log-dir "${TMPDIR:-/tmp}/tprun-demo-logs" "$@"
