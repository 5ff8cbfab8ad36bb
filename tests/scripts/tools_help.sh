#!/usr/bin/env bash
# Every tool answers --help and -h at once (tools/README.md): each executable in tools/ and
# tools/gpu/, and each Python module in tools/py/ (run with python3), must
#   * exit 0 with a usage text on stdout that names the tool;
#   * install, build and start nothing: mpirun, ninja, cmake, apt-get, pip, sudo, srun, ... are
#     replaced on PATH by stand-ins that leave a record and fail, and HOME, TMPDIR,
#     TPRUN_BUILD_DIR, TPRUN_DEMO_DIR, TPRUN_SLURM_DIR point into an empty scratch folder (the
#     venv's default path under HOME does not exist);
#   * write nothing: the scratch folder, tools/ (recursively), the checkout's top level and the
#     benches' default working folders (/tmp/tprun-bench-*) are listed before and after each call
#     and must be unchanged.
#   usage: tools_help.sh SOURCE_DIR
set -euo pipefail
src=$(cd "${1:?usage: tools_help.sh SOURCE_DIR}" && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tprun-tools-help.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/bin" "$scratch/calls" "$scratch/run"
# The commands a --help must never reach.
for c in mpirun mpiexec orterun ninja cmake make apt-get apt dpkg sudo pip pip3 ctest srun sbatch scontrol \
         slurmctld slurmd munged patchelf strip unshare; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/%s"\nexit 97\n' "$c" "$scratch/calls" "$c" >"$scratch/bin/$c"
  chmod +x "$scratch/bin/$c"
done

listing() {  # what a tool could have written besides the scratch folder: tools/, the checkout's top level, /tmp's bench folders
  find "$src/tools" -printf '%P\t%s\t%m\n'
  find "$src" -mindepth 1 -maxdepth 1 -printf '%P\n'
  find /tmp -mindepth 1 -maxdepth 1 -name 'tprun-bench*' -printf '%P\n' 2>/dev/null || true
}

tools=()
while IFS= read -r f; do tools+=("$f"); done < <(find "$src/tools" -maxdepth 2 -type f -perm -u+x | sort)
while IFS= read -r f; do tools+=("$f"); done < <(find "$src/tools/py" -maxdepth 1 -type f -name '*.py' | sort)
[ ${#tools[@]} -ge 20 ] || { echo "FAIL: only ${#tools[@]} tools found under $src/tools"; exit 1; }

fail=0 checked=0
for tool in "${tools[@]}"; do
  rel=${tool#"$src/"}
  name=$(basename "$tool")
  cmd=("$tool")
  [[ $rel == tools/py/* ]] && cmd=(python3 "$tool")
  for flag in --help -h; do
    rm -rf "${scratch:?}/run" && mkdir -p "$scratch/run/home" "$scratch/run/work" "$scratch/run/tmp"
    before=$(listing)
    rc=0
    (cd "$scratch/run/work" &&
      env -u PYTHONDONTWRITEBYTECODE -u TPRUN_VENV -u TPRUN_BIN -u TPRUN_SKIP_BUILD -u OUT -u MPIRUN \
        HOME="$scratch/run/home" TMPDIR="$scratch/run/tmp" PATH="$scratch/bin:$PATH" \
        TPRUN_BUILD_DIR="$scratch/run/work/build" TPRUN_DEMO_DIR="$scratch/run/work/demo" \
        TPRUN_SLURM_DIR="$scratch/run/work/slurm" \
        timeout 20 "${cmd[@]}" "$flag" >"$scratch/out" 2>"$scratch/err" </dev/null) || rc=$?
    after=$(listing)
    problems=()
    [ "$rc" -eq 0 ] || problems+=("exit $rc")
    [ -s "$scratch/out" ] || problems+=("no usage text on stdout")
    base=${name%.sh}; base=${base%.py}
    grep -qF "$base" "$scratch/out" || problems+=("the usage text does not name $base")
    wrote=$(cd "$scratch/run" && find . -mindepth 2 | sort | sed 5q | tr '\n' ' ' || true)
    [ -z "$wrote" ] || problems+=("wrote into the scratch HOME / working folder / TMPDIR: $wrote")
    if [ "$before" != "$after" ]; then
      problems+=("changed files: $(diff <(echo "$before") <(echo "$after") | grep '^[<>]' | sed 5q | tr '\n' ' ' || true)")
    fi
    if [ -n "$(ls -A "$scratch/calls")" ]; then
      problems+=("started: $(cat "$scratch"/calls/* | sed 3q | tr '\n' ';' || true)")
      rm -f "$scratch"/calls/*
    fi
    if [ ${#problems[@]} -gt 0 ]; then
      fail=1
      echo "FAIL: $rel $flag: ${problems[*]}"
      sed 's/^/  stderr: /;5q' "$scratch/err"
    fi
    checked=$((checked + 1))
  done
done
echo "checked ${#tools[@]} tools ($checked calls)"
exit $fail
