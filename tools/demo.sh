#!/usr/bin/env bash
# The main job, on a model the tool writes itself (no download):
#   1. set up and build if needed;
#   2. `tprun init-model` writes a tiny FLUX.1 pipeline folder (random weights,
#      tokenizers trained on bundled text) into $TPRUN_DEMO_DIR/model;
#   3. `mpirun -np 4 --bind-to none tprun run jobs/demo.toml`: a dozen prompts over 2
#      data-parallel replicas x tp 2 (rerunning resumes: finished images are kept);
#   4. prints where the images and results are.
#   tools/demo.sh [tprun run options]   e.g. --set defaults.steps=8, --retry-failed
# $TPRUN_DEMO_DIR defaults to build/demo.
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh"
"$root/tools/build.sh" tprun
eval "$(python3 -B "$root/tools/py/tprun_tools.py" shell)"  # tprun, mpirun (tools/README.md)
demo=${TPRUN_DEMO_DIR:-$root/build/demo}
mkdir -p "$demo"
if [ ! -f "$demo/model/model_index.json" ]; then
  "$tprun" init-model "$demo/model" --arch flux --preset tiny
fi
"${mpirun[@]}" -np 4 --bind-to none "$tprun" run "$root/jobs/demo.toml" --set "model=\"$demo/model\"" --out "$demo/out" \
  --log-dir "$demo/logs" "$@"
echo "demo: images in $demo/out/images, results in $demo/out/results.jsonl (model $demo/model, logs $demo/logs)"
