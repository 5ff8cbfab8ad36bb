#!/usr/bin/env bash
# Checks a GPU bundle where it was made (tools/gpu-bundle.sh runs this last):
#   1. unpacked, with `env -i` and only the bundle's lib/ and the torch lib folders on the library
#      path, every binary, Open MPI/PMIx plugin and bundled library resolves each of its libraries
#      inside the bundle, torch's folders (libtorch, CUDA's wheels) or the C/C++ runtime, and starts;
#   2. `run.sh --device cpu` passes under `env -i`, in a private mount namespace that hides the
#      system's Open MPI and PMIx folders (so the bundle's relocated copy must serve), where
#      `unshare` is allowed; without it the run still happens and the report says so.
# usage: check_bundle.sh BUNDLE_DIR PYTHON   (PYTHON: one with torch, diffusers and safetensors)
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
bundle=$(cd "$1" && pwd) py=$2
check=$(dirname "$bundle")/gpu-bundle-check
rm -rf "$check" && mkdir -p "$check/unpacked"
u=$check/unpacked
tar -xJf "$bundle/payload.tar.xz" -C "$u"
torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
site=$(cd "$torch_lib/../.." && pwd)
ldp=$u/lib:$torch_lib
for d in "$site"/nvidia/*/lib "$site"/nvidia/cu*/lib; do [ -d "$d" ] && ldp=$ldp:$d; done
. "$(dirname "$0")/bundle_env.sh"  # BUNDLE_HOST_LIBS_RE
bad=0 n=0
for f in "$u"/bin/* "$u"/mpi/bin/* "$u"/mpi/lib/openmpi3/*.so "$u"/mpi/pmix/lib/pmix/*.so "$u"/lib/*; do
  n=$((n + 1))
  deps=$(env -i LD_LIBRARY_PATH="$ldp" ldd "$f" 2>&1) || true
  if grep -q "not found" <<<"$deps"; then
    echo "check: $f: $(grep "not found" <<<"$deps" | awk '{print $1}' | tr '\n' ' ')not found"; bad=1
  fi
  while read -r name path; do
    [[ $name =~ $BUNDLE_HOST_LIBS_RE ]] && continue
    case $path in "$u"/*|"$torch_lib"/*|"$site"/nvidia/*) ;; *) echo "check: $f: $name resolves outside the bundle and torch: $path"; bad=1 ;; esac
  done < <(awk '/=> \//{print $1, $3}' <<<"$deps")
done
torch_dir=$(dirname "$torch_lib")
start() { env -i PATH=/usr/bin:/bin bash -c '. "$1" && bundle_env "$2" "$3" && shift 3 && "$@"' _ "$bundle/bundle_env.sh" "$u" "$torch_dir" "$@"; }
start "$u/bin/tprun" --version >/dev/null || { echo "check: tprun does not start"; bad=1; }
start "$u/bin/tprun_mpi_tests" --gtest_list_tests >/dev/null || { echo "check: tprun_mpi_tests does not start (MPI_Init as a singleton)"; bad=1; }
[ $bad -eq 0 ] || { echo "check: FAILED: libraries"; exit 1; }
echo "check: $n files resolve every library inside the bundle, torch's folders or the C runtime; the binaries start"

hide="/usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi /etc/openmpi"
inner="env -i HOME=\"$HOME\" PATH=/usr/bin:/bin OUT=\"$check\" bash \"$bundle/run.sh\" --device cpu --python \"$py\" --work \"$check/work\""
probe=$(mktemp -d)
if unshare -m --propagation private mount -t tmpfs none "$probe" 2>/dev/null; then
  mounts=""
  for d in $hide; do [ -d "$d" ] && mounts="$mounts mount -t tmpfs none $d &&"; done
  echo "check: run.sh --device cpu, env -i, with $hide hidden"
  set +e
  unshare -m --propagation private bash -c "$mounts $inner"
  rc=$?
else
  echo "check: run.sh --device cpu, env -i (unshare not allowed here: the system's Open MPI folders stay visible)"
  set +e
  bash -c "$inner"
  rc=$?
fi
set -e
rmdir "$probe" 2>/dev/null || true
cat "$check/gpu-report.md"
[ $rc -eq 0 ] || { echo "check: FAILED: run.sh --device cpu (exit $rc); see $check/gpu-check.log"; exit 1; }
echo "check: bundle OK ($bundle)"
