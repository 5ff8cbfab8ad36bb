#!/usr/bin/env bash
# The layers of src/ include only themselves and the layers below them. The
# per-layer static libraries make an upward call a link error; this check also
# catches an upward #include of a header-only piece.
#   usage: check_layers.sh SRC_DIR LAYER_TABLE
# LAYER_TABLE is the file src/CMakeLists.txt writes at configure time
# (build/layers.txt) from its TPRUN_LAYER_DEPS_* lists, one line per layer:
#   <layer> <the layers it may include, itself first>
# so the layer list lives in one place (src/CMakeLists.txt) and not here.
set -euo pipefail
src=${1:?usage: check_layers.sh SRC_DIR LAYER_TABLE}
table=${2:?usage: check_layers.sh SRC_DIR LAYER_TABLE (build/layers.txt, written by cmake)}
[ -f "$table" ] || { echo "no layer table $table: configure the build (tools/build.sh) first"; exit 1; }
# layer: the layers it may include (itself included)
declare -A allowed=()
while read -r layer rest; do
  case "$layer" in ''|'#'*) continue ;; esac
  allowed[$layer]=$rest
done <"$table"
[ ${#allowed[@]} -gt 0 ] || { echo "the layer table $table lists no layer"; exit 1; }
bad=0
# Every folder of src/ is a layer of the table: a new folder must be placed in src/CMakeLists.txt.
for dir in "$src"/*/; do
  name=$(basename "$dir")
  [ -n "${allowed[$name]+x}" ] || { echo "src/$name/ is not a layer of src/CMakeLists.txt (TPRUN_LAYERS)"; bad=1; }
done
for layer in "${!allowed[@]}"; do
  [ -d "$src/$layer" ] || { echo "missing layer folder $src/$layer"; bad=1; continue; }
  while IFS= read -r line; do
    file=${line%%:*}
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    [ -d "$src/$target" ] || continue  # not a layer (e.g. a system header in quotes)
    case " ${allowed[$layer]} " in
      *" $target "*) ;;
      *) echo "layering: $file includes $target/ (a layer $layer may not include: it may include ${allowed[$layer]})"; bad=1 ;;
    esac
  done < <(grep -HE '^#include "[a-z_]+/' "$src/$layer"/*.h "$src/$layer"/*.cpp 2>/dev/null || true)
done
if [ $bad -ne 0 ]; then exit 1; fi
echo "layering OK ($table): ${!allowed[*]}"
