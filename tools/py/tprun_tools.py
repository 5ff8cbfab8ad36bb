"""What every tool in tools/ shares: where things are, how tprun is started, how tables print.

Standard library only, so that any python3 can import it (the bench wrappers call it before the
venv exists; `tools/bench_tokenizer` runs under the system's python3).

Where things are (each one an environment variable, with the default every tool uses):
  TPRUN_VENV       the Python environment tools/setup.sh makes (default ~/.cache/tprun/venv)
  TPRUN_BUILD_DIR  the build folder tools/build.sh fills (default build/ in the checkout)
  TPRUN_BIN        the tprun binary (default TPRUN_BUILD_DIR/bin/tprun): point a tool at
                   another build without rebuilding anything
  TPRUN_SKIP_BUILD set: use the binary as built (no tools/setup.sh, no tools/build.sh)
  MPIRUN           the mpirun to start ranks with (default mpirun)

As a command (for the bash wrappers):
  python3 tools/py/tprun_tools.py shell      prints `root=... py=... build=... tprun=... mpirun=...`
                                             assignments for bash's eval, and exports Open MPI's
                                             run-as-root switches
  python3 tools/py/tprun_tools.py wait-idle  waits as wait_idle() does (BENCH_WAIT_IDLE=SECONDS)
  python3 tools/py/tprun_tools.py prepare [TARGET ...]
                                             tools/setup.sh, then tools/build.sh TARGET... (default
                                             tprun; its output hidden), unless TPRUN_SKIP_BUILD is set
"""
import argparse
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Open MPI refuses to start as root without these (the containers this project runs in).
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def venv_dir():
    """The Python environment tools/setup.sh makes: $TPRUN_VENV, default ~/.cache/tprun/venv."""
    return os.environ.get("TPRUN_VENV") or os.path.join(os.path.expanduser("~"), ".cache", "tprun", "venv")


def venv_python():
    """The venv's python (torch, diffusers, transformers, safetensors)."""
    return os.path.join(venv_dir(), "bin", "python")


def use_venv(module="torch"):
    """Re-runs this script under the venv's python where `module` cannot be imported here (a
    tool started as `tools/x.py` gets the system's python3). Call it after argument parsing, so
    that --help needs nothing but python3."""
    import importlib.util
    if importlib.util.find_spec(module) is not None:
        return
    py = venv_python()
    if os.path.realpath(sys.executable) == os.path.realpath(py) or not os.path.exists(py):
        sys.exit(f"{os.path.basename(sys.argv[0])}: needs the Python package {module!r}: run tools/setup.sh, "
                 f"or run this with the python of the venv it makes ({py}; TPRUN_VENV)")
    os.execv(py, [py] + sys.argv)


def build_dir():
    """$TPRUN_BUILD_DIR, default build/ in the checkout."""
    return os.environ.get("TPRUN_BUILD_DIR") or os.path.join(ROOT, "build")


def tprun_binary():
    """$TPRUN_BIN, default BUILD_DIR/bin/tprun."""
    return os.environ.get("TPRUN_BIN") or os.path.join(build_dir(), "bin", "tprun")


def mpirun_prefix():
    """$MPIRUN (default mpirun) with the flag every tool passes: --oversubscribe (2-core machines
    run more ranks than cores). Binding is each caller's choice: `mpirun(...)` unbinds by default."""
    return [os.environ.get("MPIRUN") or "mpirun", "--oversubscribe"]


def mpi_env(env=None):
    """`env` (default this process's environment) with Open MPI's run-as-root switches."""
    out = dict(os.environ if env is None else env)
    out.update(MPI_ENV)
    return out


def mpirun(np_, argv, bind="none"):
    """The command line that starts `argv` on np_ ranks: mpirun --oversubscribe --bind-to BIND -np N."""
    return mpirun_prefix() + ["--bind-to", bind, "-np", str(np_)] + list(argv)


def prepare(targets=("tprun",)):
    """tools/setup.sh and tools/build.sh TARGETS (build output hidden) unless TPRUN_SKIP_BUILD is set."""
    if os.environ.get("TPRUN_SKIP_BUILD"):
        return
    subprocess.run([os.path.join(ROOT, "tools", "setup.sh")], check=True)
    subprocess.run([os.path.join(ROOT, "tools", "build.sh")] + list(targets), check=True, stdout=subprocess.DEVNULL)


# ---- a shared machine ------------------------------------------------------------------------

def cpu_idle_pct(seconds=2.0):
    """Share of CPU time idle (idle + iowait) over the next `seconds`, from /proc/stat."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return v[3] + v[4], sum(v)
    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return 100.0 * (i1 - i0) / max(t1 - t0, 1)


def wait_idle(limit=None):
    """BENCH_WAIT_IDLE=SECONDS (or `limit`): wait up to that long until other processes leave the
    CPUs at least 85 % idle over 2 s; then run anyway, saying so on stderr."""
    if limit is None:
        limit = float(os.environ.get("BENCH_WAIT_IDLE") or 0)
    waited = 0.0
    while limit > 0 and (idle := cpu_idle_pct()) < 85:
        if waited >= limit:
            print(f"# still busy ({idle:.0f}% idle): running anyway", file=sys.stderr, flush=True)
            return
        time.sleep(8)
        waited += 10


# ---- tables ----------------------------------------------------------------------------------

def table_header(columns, out=None):
    """A markdown table's first two lines: | a | b |, |---|---|."""
    out = out or sys.stdout
    print("| " + " | ".join(columns) + " |", file=out)
    print("|" + "---|" * len(columns), file=out)


def table_row(cells, out=None):
    print("| " + " | ".join(str(c) for c in cells) + " |", file=out or sys.stdout)


def table(columns, rows, out=None):
    """A whole markdown table: the header, then one line per row (each a sequence of cells)."""
    table_header(columns, out)
    for r in rows:
        table_row(r, out)


def read_json_lines(path):
    """The JSON objects of a .jsonl file: lines that start with '{' (a log line is not a result)."""
    import json
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def median_runs(rows, key, pick="median"):
    """Repeated runs of one configuration as one row: rows grouped by key(row), sorted by seconds;
    each group's median run (pick="median") or fastest (pick="fastest"), with "all_seconds" (every
    run's seconds, ascending) added. Groups keep the order of their first run."""
    groups = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    out = []
    for g in groups.values():
        g = sorted(g, key=lambda r: r["seconds"])
        m = dict(g[len(g) // 2] if pick == "median" else g[0])
        m["all_seconds"] = [r["seconds"] for r in g]
        out.append(m)
    return out


# ---- as a command ----------------------------------------------------------------------------

def shell_assignments():
    """bash assignments for a wrapper's eval: the paths above, mpirun as an array, MPI's env."""
    values = {"root": ROOT, "py": venv_python(), "build": build_dir(), "tprun": tprun_binary()}
    lines = [f"{k}={shlex.quote(v)}" for k, v in values.items()]
    lines.append("mpirun=(" + " ".join(shlex.quote(a) for a in mpirun_prefix()) + ")")
    lines.append("export " + " ".join(f"{k}={v}" for k, v in MPI_ENV.items()))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tools/py/tprun_tools.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("shell", help="bash assignments: root, py, build, tprun, mpirun (array); MPI's env")
    sub.add_parser("wait-idle", help="wait (up to BENCH_WAIT_IDLE seconds) for an idle machine")
    p = sub.add_parser("prepare", help="setup.sh + build.sh TARGETS unless TPRUN_SKIP_BUILD")
    p.add_argument("targets", nargs="*", default=["tprun"])
    args = ap.parse_args(argv)
    if args.cmd == "shell":
        print(shell_assignments())
    elif args.cmd == "wait-idle":
        wait_idle()
    else:
        try:
            prepare(args.targets)
        except subprocess.CalledProcessError as e:
            return e.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
