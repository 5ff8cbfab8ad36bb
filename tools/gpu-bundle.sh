#!/usr/bin/env bash
# Builds the GPU check bundle: build/gpu-bundle/, at most 60 MiB, with run.sh at its root
# (README "Running the GPU check"; docs/gpu.md). A GPU host needs nothing else but its own python3
# with torch 2.11: copy the folder there (scp -r build/gpu-bundle host:) and run `gpu-bundle/run.sh`.
#
# Inside: run.sh, bundle_env.sh (its environment) and gpu_check.py, and payload.tar.xz, which run.sh unpacks:
#   bin/       tprun, tprun_mpi_tests and tprun_unit_tests (their Gpu* cases), stripped, RUNPATH $ORIGIN/../lib
#   lib/       every shared library they and Open MPI need that is not libc/libstdc++ and not
#              libtorch or CUDA's (those come from the host's torch): Open MPI, PMIx, hwloc, HDF5,
#              spdlog, fmt, Boost.Program_options, ICU, sentencepiece, libpng, RE2, xxhash, ...
#   mpi/       a relocatable Open MPI prefix: mpirun, orted, the MCA plugins that load without
#              network stacks the host lacks (UCX, libfabric, verbs), help files, PMIx's plugins
#   ctest/     the build's gpu-labelled ctest entries, with @BIN@ / @MPIEXEC@ for run.sh to fill in
#   data/      the diffusers reference transformer (tests/data/flux_transformer)
#   src/       the sources, and dev/ (the headers, CMake and pkg-config files of the Debian
#              libraries the build used), for tools/gpu/fallback_build.sh where bin/ cannot start
#   wheels/    diffusers (same version as the venv's) and what it needs beyond the host's image
# Then the bundle is checked here: with `env -i`, only the bundle's libraries and the venv's torch
# lib folder on the library path, every binary and plugin resolves every library inside the bundle,
# the torch folders or the C runtime, and `run.sh --device cpu` passes (with the system's Open MPI
# folders hidden in a private mount namespace where `unshare` allows it).
#   tools/gpu-bundle.sh            build, pack, check
#   tools/gpu-bundle.sh --no-check build and pack only
#   tools/gpu-bundle.sh --help     this text
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TPRUN_BUILD_DIR:-$root/build}
venv=${TPRUN_VENV:-$HOME/.cache/tprun/venv}
py=$venv/bin/python
check=1
[ "${1:-}" = "--no-check" ] && check=0
out=$build/gpu-bundle stage=$build/gpu-bundle.stage
limit_mib=60

"$root/tools/setup.sh"
"$root/tools/build.sh" tprun tprun_mpi_tests tprun_unit_tests >/dev/null
command -v patchelf >/dev/null || { echo "gpu-bundle: patchelf is missing (tools/setup.sh installs it)" >&2; exit 1; }

rm -rf "$stage" "$out"
p=$stage/payload
mkdir -p "$p"/{bin,lib,ctest,data,wheels} "$p"/mpi/{bin,lib/openmpi3,share,etc} "$p"/mpi/pmix/{lib/pmix,share} "$out"
torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
site=$(cd "$torch_lib/../.." && pwd)
"$py" -c 'import torch; print(torch.__version__.split("+")[0])' >"$p/TORCH_VERSION"

# --- binaries ---------------------------------------------------------------------------------------
for b in "$build/bin/tprun" "$build/tests/tprun_mpi_tests" "$build/tests/tprun_unit_tests"; do
  strip --strip-debug -o "$p/bin/$(basename "$b")" "$b"
  patchelf --set-rpath '$ORIGIN/../lib' "$p/bin/$(basename "$b")"
done

# --- Open MPI, relocatable ------------------------------------------------------------------------------
ompi_info=$(ompi_info --path all --parsable 2>/dev/null)
ompi_path() { echo "$ompi_info" | sed -n "s/^path:$1:\(.*\)/\1/p" | head -n 1; }
pkglib=$(ompi_path pkglibdir) pkgdata=$(ompi_path pkgdatadir) sysconf=$(ompi_path sysconfdir)
cp "$(readlink -f "$(command -v orterun)")" "$p/mpi/bin/mpirun"
cp "$(readlink -f "$(command -v orted)")" "$p/mpi/bin/orted"
cp -r "$pkgdata/." "$p/mpi/share/openmpi/" 2>/dev/null || { mkdir -p "$p/mpi/share/openmpi"; cp -r "$pkgdata/." "$p/mpi/share/openmpi/"; }
cp "$sysconf/openmpi-mca-params.conf" "$p/mpi/etc/" 2>/dev/null || touch "$p/mpi/etc/openmpi-mca-params.conf"
pmix_lib=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libpmix\.so\.2 /{print $NF; exit}')")")
[ -d "$pmix_lib/pmix" ] && cp "$pmix_lib"/pmix/*.so "$p/mpi/pmix/lib/pmix/"
[ -d "$pmix_lib/../share/pmix" ] && cp -r "$pmix_lib/../share/pmix" "$p/mpi/pmix/share/"
# Plugins for network stacks a GPU host's image does not carry would only print load warnings.
skip_re='libucp|libucs|libuct|libfabric|libibverbs|librdmacm|libpsm|libjvm|libcuda|libnl-|liblustre|libslurm|libpmi2?\.so'
for f in "$pkglib"/*.so; do
  if ldd "$f" 2>/dev/null | grep -Eq "$skip_re|not found"; then continue; fi
  cp "$f" "$p/mpi/lib/openmpi3/"
done

# --- the shared libraries: everything the binaries and plugins resolve, but the C runtime and torch/CUDA --
. "$root/tools/gpu/bundle_env.sh"  # BUNDLE_HOST_LIBS_RE
torch_re="^($torch_lib|$site/nvidia|/usr/local/cuda)"
collect() {
  [ -e "$1" ] || return 0
  ldd "$1" 2>/dev/null | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ $name =~ $BUNDLE_HOST_LIBS_RE ]] && continue
    [[ $path =~ $torch_re ]] && continue
    [[ $name =~ ^lib(torch|c10|cuda|cudart|cublas|cudnn|cufft|curand|cusolver|cusparse|cupti|nccl|nvrtc|nvJitLink|nvToolsExt|caffe2|shm)[._-] ]] && continue
    [ -e "$p/lib/$name" ] || cp -L "$path" "$p/lib/$name"
  done
}
for f in "$p"/bin/* "$p"/mpi/bin/* "$p"/mpi/lib/openmpi3/*.so "$p"/mpi/pmix/lib/pmix/*.so; do collect "$f"; done
# libgomp comes with torch's own OpenMP where it uses one; the system's is needed by HDF5/others only
# if they link it: collected above when so.

# --- ctest's gpu entries, the reference data, sources --------------------------------------------
"$py" - "$build/tests/CTestTestfile.cmake" "$build" "$(command -v mpirun)" "$p/ctest" <<'PY'
import re, sys
src, build, mpiexec, out = sys.argv[1:5]
text = open(src).read()
# One statement per add_test / set_tests_properties (a property value may hold a newline).
statements = re.split(r"\n(?=add_test\(|set_tests_properties\(|subdirs\(|#)", text)
keep = []
for st in statements:
    if not re.match(r"(add_test|set_tests_properties)\(\[=\[gpu_\w+\]=\]", st):
        continue
    st = re.sub(r' _BACKTRACE_TRIPLES "[^"]*"', "", st)
    for path in (f"{build}/tests/", f"{build}/bin/"):
        st = st.replace(path, "@BIN@/")
    st = st.replace(f'"{mpiexec}"', '"@MPIEXEC@"')
    st = re.sub(r'"/usr/bin/(mpirun|mpiexec|orterun)[^"]*"', '"@MPIEXEC@"', st)
    st = re.sub(r"TPRUN_SRC=[^;\"]*", "TPRUN_SRC=@BIN@/../src", st)
    keep.append(st.rstrip())
if not any(st.startswith("add_test") for st in keep):
    sys.exit(f"{src}: no gpu_* tests found")
open(f"{out}/CTestTestfile.cmake.in", "w").write("\n".join(keep) + "\n")
# The same commands for a host without ctest (a test that only skips passes there).
cmds = ["set -u", "rc=0"]
for st in keep:
    m = re.match(r"add_test\(\[=\[(\w+)\]=\] (.*)\)$", st, re.S)
    if m:
        args = " ".join(re.findall(r'"[^"]*"', m.group(2)))
        cmds.append(f'echo "== {m.group(1)}"; {args} || rc=1')
cmds.append("exit $rc")
open(f"{out}/commands.sh.in", "w").write("\n".join(cmds) + "\n")
PY
cp -r "$root/tests/data/flux_transformer" "$p/data/"
mkdir -p "$p/src"
(cd "$root" && git ls-files -co --exclude-standard -- CMakeLists.txt cmake src tests tools jobs | grep -v '^tests/data/' \
  | tar -cf - -T - | tar -xf - -C "$p/src")
cp -r "$root/tests/data" "$p/src/tests/"
bash "$root/tools/gpu/pack_dev.sh" "$build" "$p/dev"

# --- diffusers for the side-by-side step ------------------------------------------------------------
dver=$("$py" -c 'import diffusers; print(diffusers.__version__)')
wheels=${TPRUN_GPU_WHEELS:-$HOME/.cache/tprun/gpu-wheels}
mkdir -p "$wheels"
# The GPU image has huggingface_hub, safetensors, numpy, requests, regex, filelock, Pillow; not these.
for req in "diffusers==$dver" importlib_metadata; do
  name=${req%%=*}
  ls "$wheels"/"${name//-/_}"-*.whl >/dev/null 2>&1 || ls "$wheels"/"$name"-*.whl >/dev/null 2>&1 || \
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "$req" || \
    echo "gpu-bundle: warning: could not download $req (no network?): the step-time comparison will need diffusers on the host" >&2
done
cp "$wheels"/*.whl "$p/wheels/" 2>/dev/null || true

# --- pack ------------------------------------------------------------------------------------------
{
  echo "tprun $(cd "$root" && git describe --always --dirty 2>/dev/null || echo unknown), bundled $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "torch $(cat "$p/TORCH_VERSION"), diffusers $dver"
} >"$p/BUNDLE"
cp "$p/BUNDLE" "$out/BUNDLE"
tar -C "$p" -cf - . | xz -T0 -6 >"$out/payload.tar.xz"
cp "$root/tools/gpu/run.sh" "$root/tools/gpu/bundle_env.sh" "$root/tools/gpu/gpu_check.py" "$out/"
chmod +x "$out/run.sh"
size=$(du -sb "$out" | cut -f1)
echo "gpu-bundle: $out: $((size / 1048576)) MiB ($(du -sh "$p" | cut -f1) unpacked; $(ls "$p/lib" | wc -l) libraries, $(ls "$p/mpi/lib/openmpi3" | wc -l) MPI plugins)"
[ "$size" -le $((limit_mib * 1048576)) ] || { echo "gpu-bundle: over the ${limit_mib} MiB limit" >&2; exit 1; }
[ $check -eq 1 ] || exit 0

# --- check it here ------------------------------------------------------------------------------------
exec bash "$root/tools/gpu/check_bundle.sh" "$out" "$py"
