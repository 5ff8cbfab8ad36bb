#!/usr/bin/env bash
# The layers of src/ (src/CMakeLists.txt) include only themselves and the
# layers below them. The per-layer static libraries make an upward call a link
# error; this check also catches an upward #include of a header-only piece.
#   usage: check_layers.sh SRC_DIR
set -euo pipefail
src=${1:?usage: check_layers.sh SRC_DIR}
# layer: the layers it may include (itself included)
declare -A allowed=(
  [runtime]="runtime"
  [dist]="dist runtime"
  [checkpoint]="checkpoint runtime"
  [memory]="memory checkpoint runtime"
  [text]="text checkpoint runtime"
  [parallel]="parallel memory checkpoint dist runtime"
  [models]="models parallel memory checkpoint dist runtime"
  [pipelines]="pipelines text models parallel memory checkpoint dist runtime"
  [presets]="presets pipelines text models parallel memory checkpoint dist runtime"
  [jobs]="jobs pipelines text models parallel memory checkpoint dist runtime"
  [cli]="cli jobs presets pipelines text models parallel memory checkpoint dist runtime"
)
bad=0
for layer in "${!allowed[@]}"; do
  [ -d "$src/$layer" ] || { echo "missing layer folder $src/$layer"; bad=1; continue; }
  while IFS= read -r line; do
    file=${line%%:*}
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    [ -d "$src/$target" ] || continue  # not a layer (e.g. a system header in quotes)
    case " ${allowed[$layer]} " in
      *" $target "*) ;;
      *) echo "layering: $file includes $target/ (a layer above $layer)"; bad=1 ;;
    esac
  done < <(grep -HE '^#include "[a-z_]+/' "$src/$layer"/*.h "$src/$layer"/*.cpp 2>/dev/null || true)
done
if [ $bad -ne 0 ]; then exit 1; fi
echo "layering OK: ${!allowed[*]}"
