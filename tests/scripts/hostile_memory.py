#!/usr/bin/env python3
"""Hostile [memory] input: user regexes, disk-offload group files and their folder key.

Cases (one ctest entry each; `hostile_memory.py TPRUN MPIRUN CASE`):
  regex_catastrophic    layerwise_casting.skip = ["(.*)*Q"] (exponential for a backtracking engine)
                        via --memory and via a manifest: the load finishes well inside 60 s (RE2
                        matches in linear time) and equals a run without the pattern's effect; a
                        backreference or lookaround is one ConfigError naming the key and RE2, on
                        every rank, before any weight is read.
  group_same_size_edit  bytes flipped inside a disk-offload group file, size and mtime kept: the
                        next run finds the hash mismatch, logs the rewrite, and equals the plain run.
  cache_key_settings    three settings (bf16, fp32, fp32 + fp8 storage) on one disk_path, first all at
                        once, then one after another: all succeed, none kills another ("replaced by
                        other weights"), the second round reuses every group file and repeats the
                        first round's output.
  shared_writers        a dp = 2 job on one node, one disk_path: each group file written once in all
                        (the other rank finds it finished), images equal to a run without offload.
  disk_full             disk_path on a tiny tmpfs (or a file size limit when no tmpfs can be
                        mounted): exit 7, an I/O error naming the path and the errno text.
"""
import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
from PIL import Image
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import (  # noqa: E402
    Harness, jsonl, prompt_rows, run_cases, transformer_inputs, write_manifest)

H = None
EXACT_TOL = 1e-5
BOUND_S = 60  # a load that hung forever before; linear time is well under a second of matching


def run_bounded(args, np_=1, timeout=BOUND_S, wrap=(), log_dir=""):
    """(exit code, log, seconds) of `mpirun -np np_ [WRAP] tprun ARGS`; the whole process group is killed on
    a timeout (rc None), so a hung rank never outlives the test. `log_dir`: every rank's log file there."""
    cmd = [H.mpirun, "--oversubscribe", "-np", str(np_), *wrap, H.tprun, *args, "--log-dir", log_dir]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out, time.monotonic() - t0


def forward_args(work, folder, tag, memory=(), dtype=None):
    inp, out = os.path.join(work, f"{tag}_in.safetensors"), os.path.join(work, f"{tag}_out.safetensors")
    save_file(transformer_inputs(folder, "flux"), inp)
    args = ["forward", "--model", folder, "--component", "transformer", "--inputs", inp, "--out", out]
    if dtype:
        args += ["--dtype", dtype]
    for m in memory:
        args += ["--memory", m]
    return args, out


def forward(work, folder, tag, memory=(), dtype=None, timeout=300):
    args, out = forward_args(work, folder, tag, memory, dtype)
    rc, log, _ = run_bounded(args, timeout=timeout)
    if not H.check(rc == 0, f"{tag}: forward ran" + ("" if rc == 0 else f" (exit {rc}): {log[-1500:]}")):
        return None, log
    return load_file(out)["sample"].float(), log


def same(tag, got, want, tol=EXACT_TOL):
    if got is None or want is None:
        H.check(False, f"{tag}: no output to compare")
        return
    diff = (got - want).abs().max().item()
    H.check(diff <= tol, f"{tag}: max |diff| {diff:.3g} (<= {tol})")


def disk(path, per_group=None):
    extra = f", blocks_per_group={per_group}" if per_group else ""
    return f'offload={{type="block_level", to="disk", disk_path="{path}"{extra}}}'


def offload_counts(log):
    """[(written, rewritten, reused, shared)] of every 'disk offload: ...' summary line in `log`."""
    pat = (r"disk offload: (\d+) group files written \((\d+) of them rewritten\), (\d+) reused, "
           r"(\d+) written meanwhile")
    return [tuple(int(x) for x in m.groups()) for m in re.finditer(pat, log)]


def groups_logged(log):
    return [int(m.group(1)) for m in re.finditer(r"\d+ of \d+ tensors in (\d+) offload groups", log)]


def job(work, name, folder, out, dp=1, memory=""):
    """work/NAME.toml: four requests r0..r3 at tp 1 x dp, `memory` as the [memory] table's body."""
    requests = jsonl(os.path.join(work, f"{name}.jsonl"),
                     prompt_rows(4, ["a red fox", "a blue boat", "a green hill", "a grey cat"], prefix="r"))
    return write_manifest(os.path.join(work, f"{name}.toml"), folder, requests, out, parallel={"tp": 1, "dp": dp},
                          tail=f"[memory]\n{memory}\n")


def images(out):
    got = {}
    for p in sorted(glob.glob(os.path.join(out, "**", "*.png"), recursive=True)):
        got[os.path.relpath(p, out)] = np.asarray(Image.open(p).convert("RGB"), dtype=np.int32)
    return got


def case_regex_catastrophic(work):
    folder = H.init_model(work, "flux")
    fp8 = 'layerwise_casting={storage="float8_e4m3fn", skip=["(.*)*Q"]}'
    # No module name holds a "Q": the pattern skips nothing, as skip = [] does.
    want, _ = forward(work, folder, "fp8_no_skip", ('layerwise_casting={storage="float8_e4m3fn", skip=[]}',))
    args, out = forward_args(work, folder, "catastrophic", (fp8,))
    rc, log, took = run_bounded(args)
    H.check(rc == 0, f"--memory skip = [\"(.*)*Q\"]: the load finishes (exit {rc}, {took:.1f} s, bound {BOUND_S} s)"
            + ("" if rc == 0 else f": {log[-800:]}"))
    if rc == 0:
        same("(.*)*Q skips nothing: equal to skip = []", load_file(out)["sample"].float(), want)
    # The same pattern from a manifest: a whole `run` finishes.
    m = job(work, "job", folder, os.path.join(work, "out"),
            memory='layerwise_casting = { storage = "float8_e4m3fn", skip = ["(.*)*Q", "(x+x+)+y"] }')
    rc, log, took = run_bounded(["run", m, "--progress", "none"], timeout=BOUND_S * 3)
    H.check(rc == 0, f"manifest skip = [\"(.*)*Q\", \"(x+x+)+y\"]: the run finishes (exit {rc}, {took:.1f} s)"
            + ("" if rc == 0 else f": {log[-800:]}"))
    # What RE2 lacks: one ConfigError naming the key, before any weight is read.
    bad = (("backreference", r"(a)\\1"), ("lookahead", "to_(?=q)"), ("lookbehind", "(?<=attn)\\\\.to_q"))
    for label, pattern in bad:
        setting = f'layerwise_casting={{storage="float8_e4m3fn", skip=["norm", "{pattern}"]}}'
        args, _ = forward_args(work, folder, f"bad_{label}", (setting,))
        H.expect_config_error(f"--memory skip with a {label}", args,
                              "--memory layerwise_casting.skip: '", np_=1, absent="tensors stored in")
        rc, log = H.run(args, np_=1, timeout=120)
        ok = "RE2" in log and "re2/wiki/Syntax" in log
        H.check(ok, f"{label}: the message explains RE2 syntax" + ("" if ok else f": {log[-400:]}"))
    m = job(work, "bad", folder, os.path.join(work, "bad_out"),
            memory='layerwise_casting = { storage = "float8_e4m3fn", skip = ["ok", "(b)\\\\1"] }')
    line = next(i for i, l in enumerate(open(m).read().splitlines(), 1) if "layerwise_casting" in l)
    H.expect_config_error("manifest skip with a backreference", ["run", m],
                          f"bad.toml:{line}: memory.layerwise_casting.skip: '(b)\\1' is not a regular expression "
                          "in RE2",
                          np_=2)
    H.check(not os.path.exists(os.path.join(work, "bad_out")), "the refused manifest wrote no output folder")


def group_files(root):
    return sorted(glob.glob(os.path.join(root, "*", "tp0of1", "*.safetensors")))


def case_group_same_size_edit(work):
    folder = H.init_model(work, "flux")
    root = os.path.join(work, "disk")
    plain, _ = forward(work, folder, "plain")
    first, log1 = forward(work, folder, "first", (disk(root),))
    same("first disk run vs plain", first, plain)
    files = group_files(root)
    if not H.check(len(files) > 2, f"group files written ({len(files)})"):
        return
    victim = files[len(files) // 2]
    st = os.stat(victim)
    with open(victim, "r+b") as f:  # flip the last 256 bytes: tensor data, never the header
        f.seek(st.st_size - 256)
        data = bytes(b ^ 0x5A for b in f.read(256))
        f.seek(st.st_size - 256)
        f.write(data)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    st2 = os.stat(victim)
    H.check(st2.st_size == st.st_size and st2.st_mtime_ns == st.st_mtime_ns, "the edit kept size and mtime")
    second, log2 = forward(work, folder, "second", (disk(root),))
    lines = [l for l in log2.splitlines() if os.path.basename(victim) in l and "rewriting it" in l]
    H.check(len(lines) == 1 and "XXH3" in lines[0],
            f"the edited file is found by its hash and rewritten, with a log line: {lines or log2[-1200:]}")
    counts = offload_counts(log2)
    H.check(counts and counts[0][0] == 1 and counts[0][1] == 1 and counts[0][2] == len(files) - 1,
            f"only the edited group is rewritten, the others reused: {counts}")
    same("after the same-size edit: equal to the plain run", second, plain)
    third, log3 = forward(work, folder, "third", (disk(root),))
    H.check(offload_counts(log3)[:1] == [(0, 0, len(files), 0)],
            f"the rewritten file is reused next: {offload_counts(log3)}")
    same("third run vs plain", third, plain)


def case_cache_key_settings(work):
    folder = H.init_model(work, "flux")
    root = os.path.join(work, "disk")
    settings = {
        "bf16": ("bf16", ()),
        "fp32": ("fp32", ()),
        "fp8": ("fp32", ('layerwise_casting={storage="float8_e4m3fn"}',)),
    }
    # Round 1: all three at once on one disk_path.
    procs = {}
    for name, (dtype, memory) in settings.items():
        args, out = forward_args(work, folder, f"r1_{name}", memory + (disk(root),), dtype)
        cmd = [H.mpirun, "--oversubscribe", "-np", "1", H.tprun, *args, "--log-dir", ""]
        procs[name] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out)
    first = {}
    for name, (p, out) in procs.items():
        log, _ = p.communicate(timeout=600)
        ok = H.check(p.returncode == 0 and "replaced by other weights" not in log,
                     f"round 1 {name} (concurrent): exit {p.returncode}"
                     + ("" if p.returncode == 0 else f": {log[-1200:]}"))
        first[name] = load_file(out)["sample"].float() if ok else None
    folders = sorted(os.path.basename(d) for d in glob.glob(os.path.join(root, "*")))
    H.check(len(folders) == 3, f"one folder per setting under disk_path: {folders}")
    # Round 2 twice, interleaved: every group reused, the same output.
    for rnd in (2, 3):
        for name, (dtype, memory) in settings.items():
            got, log = forward(work, folder, f"r{rnd}_{name}", memory + (disk(root),), dtype)
            counts = offload_counts(log)
            H.check(bool(counts) and counts[0][0] == 0 and counts[0][2] == groups_logged(log)[0],
                    f"round {rnd} {name}: every group file reused, none written: {counts}")
            same(f"round {rnd} {name} vs round 1", got, first[name])
    H.check(first["bf16"] is not None and first["fp32"] is not None
            and (first["bf16"] - first["fp32"]).abs().max().item() > 0,
            "the settings really store different bytes (bf16 and fp32 outputs differ)")


def case_shared_writers(work):
    folder = H.init_model(work, "flux")
    root = os.path.join(work, "disk")
    plain_out, off_out = os.path.join(work, "plain"), os.path.join(work, "offloaded")
    rc, log, _ = run_bounded(["run", job(work, "plain", folder, plain_out, dp=2), "--progress", "none"], np_=2,
                             timeout=600)
    H.check(rc == 0, f"plain dp 2 run: exit {rc}" + ("" if rc == 0 else f": {log[-1200:]}"))
    m = job(work, "off", folder, off_out, dp=2,
            memory=f'offload = {{ type = "block_level", to = "disk", disk_path = "{root}" }}')
    logs = os.path.join(work, "logs")
    rc, log, _ = run_bounded(["run", m, "--progress", "none"], np_=2, timeout=600, log_dir=logs)
    H.check(rc == 0, f"dp 2 run with disk offload: exit {rc}" + ("" if rc == 0 else f": {log[-1200:]}"))
    files = glob.glob(os.path.join(root, "*", "tp0of1", "*.safetensors"))
    ranks = []
    for r in (0, 1):
        path = os.path.join(logs, f"rank-{r:04d}.log")
        text = open(path).read() if os.path.exists(path) else ""
        ranks.append((offload_counts(text), groups_logged(text)))
    H.check(all(c and len(c) == len(g) and sum(g) == len(files) for c, g in ranks),
            f"each rank logs an offload summary per component, over all {len(files)} group files: {ranks}")
    written = sum(x[0] for c, _ in ranks for x in c)
    H.check(len(files) > 2 and written == len(files),
            f"each group file written once in all: {written} writes for {len(files)} files")
    H.check(sum(x[2] + x[3] for c, _ in ranks for x in c) == len(files),
            f"the rest found the finished files (reused, or written meanwhile by the other rank)")
    a, b = images(plain_out), images(off_out)
    H.check(a and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a),
            f"dp 2 with disk offload gives the plain images ({len(a)} images)")


def case_disk_full(work):
    folder = H.init_model(work, "flux")
    small = os.path.join(work, "small")
    os.makedirs(small)
    mounted = os.geteuid() == 0 and not os.environ.get("TPRUN_TEST_NO_TMPFS") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", small], stderr=subprocess.DEVNULL).returncode == 0
    wrap, reason = (), "No space left on device"
    if mounted:
        with open(os.path.join(small, "filler"), "wb") as f:  # leave about 8 kB: less than one group file
            st = os.statvfs(small)
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - 8 * 1024))
    else:
        print("cannot mount a tmpfs here: using RLIMIT_FSIZE", flush=True)
        reason = "File too large"

        # On tprun alone (mpirun's own shared-memory files are larger); an ignored SIGXFSZ survives exec,
        # so writes past the limit fail with EFBIG.
        wrap = (sys.executable, "-c", "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, "
                "signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (16384, resource.RLIM_INFINITY)); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    try:
        root = os.path.join(small, "offload")
        for kind in ("forward", "run"):
            if kind == "forward":
                args, out = forward_args(work, folder, "full", (disk(root),))
            else:
                out = os.path.join(work, "job_out")
                args = ["run", job(work, "full", folder, out,
                                   memory=f'offload = {{ type = "block_level", to = "disk", disk_path = "{root}" }}'),
                        "--progress", "none"]
            rc, log, _ = run_bounded(args, timeout=300, wrap=wrap)
            lines = [l for l in log.splitlines() if reason in l and root in l]
            H.check(rc == 7, f"{kind}: a full disk_path is exit 7 (I/O error), not 4: exit {rc}")
            H.check(bool(lines) and "I/O error" in log,
                    f"{kind}: the error names the path under disk_path and '{reason}': {lines[:1] or log[-2500:]}")
            H.check(not glob.glob(os.path.join(root, "**", "*.tmp-*"), recursive=True),
                    f"{kind}: no temporary left behind")
            H.check(not glob.glob(os.path.join(out, "**", "*.png"), recursive=True) and not os.path.isfile(out),
                    f"{kind}: no output written")
    finally:
        if mounted:
            subprocess.run(["umount", small])


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {"regex_catastrophic": case_regex_catastrophic,
                         "group_same_size_edit": case_group_same_size_edit,
                         "cache_key_settings": case_cache_key_settings,
                         "shared_writers": case_shared_writers,
                         "disk_full": case_disk_full}, "tprun-hostile-memory")


if __name__ == "__main__":
    sys.exit(main())
