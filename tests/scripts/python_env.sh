#!/usr/bin/env bash
# The Python environment the script and parity tests run in: the venv tools/setup.sh makes
# (~/.cache/tprun/venv, or $TPRUN_VENV when cmake ran) with every package of tools/requirements.txt.
#   python_env.sh VENV_PYTHON REQUIREMENTS              checks it; exit 1 naming what is missing
#   python_env.sh VENV_PYTHON REQUIREMENTS SCRIPT ARGS  checks it, then runs SCRIPT with it
# cmake runs the check at configure time (a warning where it fails) and the ctest entry
# python_env runs it again; where the check failed at configure time, every script test runs
# through this file, so each one fails naming what is missing instead of not existing.
set -uo pipefail
py=${1:?usage: python_env.sh VENV_PYTHON REQUIREMENTS [SCRIPT ARGS...]}
req=${2:?usage: python_env.sh VENV_PYTHON REQUIREMENTS [SCRIPT ARGS...]}
shift 2
fix="run tools/setup.sh (it makes the venv from tools/requirements.txt), or point TPRUN_VENV at such a venv and re-run cmake"
if [ ! -x "$py" ]; then
  echo "tprun: the Python environment of the script tests is missing: $py does not exist; $fix" >&2
  exit 1
fi
# The distribution names of the requirements (name before ==, comments and blank lines skipped).
names=$(sed -E 's/#.*//; s/[[:space:]]//g; s/[=<>!~;[].*//' "$req" | grep -v '^$' | paste -sd' ')
[ -n "$names" ] || { echo "tprun: no requirement read from $req" >&2; exit 1; }
# importlib.metadata reads the installed packages' metadata without importing them (fast).
# shellcheck disable=SC2086
missing=$("$py" - $names <<'PY' 2>&1
import sys
from importlib import metadata
missing = []
for name in sys.argv[1:]:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
PY
) || { echo "tprun: $py does not run: $missing; $fix" >&2; exit 1; }
if [ -n "$missing" ]; then
  echo "tprun: the Python environment of the script tests ($py) lacks ${missing% } (required by $req); $fix" >&2
  exit 1
fi
if [ $# -eq 0 ]; then
  echo "Python environment OK: $py has $names"
  exit 0
fi
exec "$py" "$@"
