#!/usr/bin/env bash
# Installs what tprun needs on a Debian 12 machine; idempotent and quiet when
# nothing is missing. Called by tools/test.sh and tools/demo.sh.
#   tools/setup.sh        (no arguments; TPRUN_VENV: where the venv goes)
#   * Debian packages: compilers (and patchelf, xz for tools/gpu-bundle.sh), Open MPI, parallel HDF5, spdlog, Boost,
#     GoogleTest, nlohmann-json, toml++, sentencepiece, libpng, ccache, clang, and the ffmpeg program
#     (MP4 videos are encoded by running it; tprun links none of its libraries: docs/video.md).
#   * A Python virtual environment outside the checkout ($TPRUN_VENV, default
#     ~/.cache/tprun/venv) with the pinned torch wheel (libtorch for CMake) and
#     diffusers/transformers/safetensors. Rebuilt only when
#     tools/requirements.txt changes; pip's cache is kept between runs.
set -euo pipefail
for a in "$@"; do case $a in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac; done
here=$(cd "$(dirname "$0")" && pwd)
venv=${TPRUN_VENV:-$HOME/.cache/tprun/venv}

packages=(
  build-essential cmake ninja-build pkg-config ccache clang bc git patchelf xz-utils
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev
  libspdlog-dev libfmt-dev libboost-program-options-dev libgtest-dev
  nlohmann-json3-dev libtomlplusplus-dev libsentencepiece-dev libicu-dev libpng-dev
  libre2-dev libxxhash-dev
  ffmpeg
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The venv: recreated only when the pinned requirements change.
stamp="$venv/.tprun-requirements.sha256"
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: preparing the Python environment in $venv (torch wheel, diffusers; several GB on first run)"
  start=$(date +%s)
  mkdir -p "$(dirname "$venv")"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" 2>/dev/null || {
      [ "$(id -u)" -eq 0 ] && apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    }
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
  echo "$want" > "$stamp"
  echo "setup: Python environment ready in $(( $(date +%s) - start )) s"
fi
