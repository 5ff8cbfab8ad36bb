#!/usr/bin/env python3
"""`tprun run` under mpirun: bad inputs, determinism, resume after a killed
rank, failed requests, SIGTERM, and the hostile-run cases of the output folder:
one run per folder (lock), disk full, resume of incomplete outputs and of a
results log holding someone's text, requeue after SIGTERM to mpirun itself.

usage: run_job_cases.py TPRUN MPIRUN CASE
CASE: bad_inputs | determinism | resume_kill | failed_request | sigterm | output_lock | disk_full |
      resume_incomplete | mpirun_sigterm_requeue
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import jsonl, prompt_rows, results, tiny_flux, write, write_manifest  # noqa: E402

TPRUN, MPIRUN, CASE = sys.argv[1:4]


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def mpirun(np_, *args, check=True, timeout=300):
    cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", TPRUN, *args]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and p.returncode != 0:
        print(p.stdout)
        fail(f"exit code {p.returncode}")
    return p


def manifest(tmp, name, model, requests, out, tp=1, dp=0, extra="", steps=None):
    """tmp/NAME: the shared job manifest with [parallel] tp, dp; `extra` after [output] dir; `steps` for
    requests heavier than the default two steps."""
    return write_manifest(os.path.join(tmp, name), model, requests, out, parallel={"tp": tp, "dp": dp},
                          defaults=None if steps is None else {"steps": steps}, tail=extra)


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int32)


def tiny_model(tmp):
    return tiny_flux(TPRUN, os.path.join(tmp, "model"))


PROMPTS = prompt_rows(8)


def retyped(path):
    write(path, open(path).read().replace("steps = 2", "steps = \"2\""))
    return path


def bad_inputs(tmp):
    model = tiny_model(tmp)
    good = jsonl(os.path.join(tmp, "good.jsonl"), PROMPTS[:2])
    out = os.path.join(tmp, "out")
    long_id = "a" * 5000
    broken = os.path.join(tmp, "broken_model")  # a checkpoint that fails to load: nothing may be written
    shutil.copytree(model, broken)
    weights = os.path.join(broken, "transformer", "diffusion_pytorch_model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    cases = [
        ("unknown key", manifest(tmp, "a.toml", model, good, out, extra="stepz = 1\n"), "a.toml:14: output.stepz: unknown key"),
        ("wrong type", retyped(manifest(tmp, "b.toml", model, good, out)), "b.toml:9: defaults.steps: must be an integer"),
        ("missing requests", manifest(tmp, "c.toml", model, os.path.join(tmp, "nope.jsonl"), out),
         "requests: " + os.path.join(tmp, "nope.jsonl") + ": no such file"),
        ("duplicate id", manifest(tmp, "d.toml", model, jsonl(os.path.join(tmp, "dup.jsonl"), [PROMPTS[0], PROMPTS[0]]), out),
         "dup.jsonl:2: id: 'p0' is used twice (first on line 1)"),
        ("bad json", manifest(tmp, "e.toml", model, write(os.path.join(tmp, "bad.jsonl"), '{"id": "a", "prompt": "x"}\n{"id": "b",\n'), out),
         "bad.jsonl:2: json:"),
        ("tp x dp", manifest(tmp, "f.toml", model, good, out, tp=1, dp=3), "parallel.tp 1 x parallel.dp 3 must equal the number of ranks 2"),
        ("missing model", manifest(tmp, "g.toml", os.path.join(tmp, "nomodel"), good, out),
         "model: " + os.path.join(tmp, "nomodel") + " is not a pipeline folder"),
        ("requests a directory", manifest(tmp, "h.toml", model, tmp, out), "requests: " + tmp + " is a directory"),
        ("requests /dev/zero", manifest(tmp, "i.toml", model, "/dev/zero", out),
         "requests: /dev/zero is not a regular file (a character device)"),
        ("5000-char id", manifest(tmp, "j.toml", model, jsonl(os.path.join(tmp, "long.jsonl"), [{"id": long_id, "prompt": "x"}]), out),
         "'" + "a" * 64 + "\u2026(5000 chars)' is not a valid id"),
        ("out inside the model", manifest(tmp, "k.toml", model, good, os.path.join(model, "out")),
         "output.dir: " + os.path.join(model, "out") + " is inside the model folder"),
        ("bad checkpoint", manifest(tmp, "l.toml", broken, good, out), "checkpoint error"),
    ]
    for name, path, want in cases:
        p = mpirun(2, "run", path, "--progress", "none", check=False)
        lines = [l for l in p.stdout.splitlines() if want in l]
        print(f"{name}: exit {p.returncode}, {len(lines)} rank(s) named it", flush=True)
        if p.returncode == 0:
            fail(f"{name}: exit code 0")
        if not lines:
            print(p.stdout)
            fail(f"{name}: no message containing {want!r}")
        if long_id[:200] in p.stdout:
            fail(f"{name}: a 5000-character id is echoed whole")
        for folder in (out, os.path.join(model, "out")):
            if os.path.exists(folder):
                fail(f"{name}: the output folder {folder} was created")
    # tp not dividing the heads fails in the load: no output folder either.
    p = mpirun(3, "run", manifest(tmp, "m.toml", model, good, out, tp=3), "--progress", "none", check=False)
    print(f"tp 3: exit {p.returncode}", flush=True)
    if p.returncode != 3 or "does not divide" not in p.stdout:
        print(p.stdout)
        fail(f"tp 3: exit {p.returncode}, expected 3 naming the heads")
    if os.path.exists(out):
        fail("tp 3: the output folder was created before the model loaded")
    # A folder that is not empty and holds no tprun results: a loud warning (the run goes on).
    foreign = os.path.join(tmp, "thesis")
    os.makedirs(foreign)
    write(os.path.join(foreign, "chapter1.tex"), "x")
    p = mpirun(2, "run", manifest(tmp, "n.toml", model, good, foreign), "--progress", "none")
    if "IS NOT EMPTY and holds no tprun results" not in p.stdout:
        print(p.stdout)
        fail("no warning for a foreign non-empty output folder")


def determinism(tmp):
    model = tiny_model(tmp)
    rows = PROMPTS[:3] + [{"id": "seeded", "prompt": "a quiet harbor", "seed": 99, "height": 32, "width": 64}]
    fwd = jsonl(os.path.join(tmp, "fwd.jsonl"), rows)
    rev = jsonl(os.path.join(tmp, "rev.jsonl"), rows[::-1])
    runs = {}
    for name, np_, tp, req, bs in [("dp1tp1", 1, 1, fwd, 1), ("dp2tp1", 2, 1, fwd, 1), ("dp1tp2", 2, 2, fwd, 1),
                                   ("dp2tp2", 4, 2, fwd, 1), ("dp2tp1_reversed", 2, 1, rev, 1),
                                   ("batch2_dp1tp1", 1, 1, fwd, 2), ("batch2_dp2tp1_reversed", 2, 1, rev, 2)]:
        out = os.path.join(tmp, "out_" + name)
        mpirun(np_, "run", manifest(tmp, name + ".toml", model, req, out, tp=tp, extra=f"batch_size = {bs}\n"),
               "--progress", "none")
        runs[name] = out
        recs = results(out)
        if sorted(r["id"] for r in recs) != sorted(r["id"] for r in rows) or any(r["status"] != "done" for r in recs):
            fail(f"{name}: results {recs}")
    base = runs["dp1tp1"]
    for name, out in runs.items():
        for r in rows:
            a, b = pixels(os.path.join(base, "images", r["id"] + ".png")), pixels(os.path.join(out, "images", r["id"] + ".png"))
            d = int(np.abs(a - b).max())
            print(f"{name} {r['id']}: max pixel diff vs dp1tp1 {d}", flush=True)
            # dp and order never change a bit; tp sums partial products in another order (fp32), which may
            # move a pixel by one level at a rounding boundary.
            limit = 0 if "tp1" in name and "batch" not in name else 1
            if d > limit:
                fail(f"{name} {r['id']}: differs by {d} > {limit}")
            if name == "batch2_dp2tp1_reversed":  # batches are formed in id order: same batches at any dp / order
                c = pixels(os.path.join(runs["batch2_dp1tp1"], "images", r["id"] + ".png"))
                if int(np.abs(b - c).max()) != 0:
                    fail(f"batched {r['id']}: differs between dp 1 and dp 2")
    seeds = {r["id"]: r["seed"] for r in results(base)}
    if seeds["seeded"] != 99:
        fail(f"explicit seed not used: {seeds}")


def resume_kill(tmp):
    model = tiny_model(tmp)
    rows = PROMPTS + [{"id": f"q{i}", "prompt": f"variation {i} of a garden"} for i in range(16)]
    req = jsonl(os.path.join(tmp, "r.jsonl"), rows)
    out = os.path.join(tmp, "out")
    manifest(tmp, "job.toml", model, req, out, tp=1, extra='formats = ["png", "hdf5", "latents"]\n', steps=60)
    cmd = [MPIRUN, "-np", "2", "--oversubscribe", TPRUN, "run", os.path.join(tmp, "job.toml"), "--progress", "none"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = os.path.join(out, "results.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(log) and len(results(out)) >= 3:
            break
        time.sleep(0.05)
    else:
        p.kill()
        fail("no results appeared")
    pids = subprocess.run(["pgrep", "-f", "-P", str(p.pid), "tprun"], stdout=subprocess.PIPE, text=True).stdout.split()
    if not pids:
        fail("could not find the ranks")
    print("killing rank pid", pids[-1], "after", len(results(out)), "results", flush=True)
    os.kill(int(pids[-1]), signal.SIGKILL)
    t0 = time.time()
    p.communicate(timeout=60)
    print(f"job ended {time.time() - t0:.1f} s after the kill, exit {p.returncode}", flush=True)
    if p.returncode == 0:
        fail("the killed job exited 0")
    before = len(results(out))
    if before >= len(rows):
        fail("the batch finished before the kill; make the requests heavier")
    mpirun(2, "run", os.path.join(tmp, "job.toml"), "--progress", "none")
    recs = results(out)
    done = [r["id"] for r in recs if r["status"] == "done"]
    print(f"{before} results before the rerun, {len(recs)} after", flush=True)
    if sorted(done) != sorted(r["id"] for r in rows):
        fail(f"after resume, done ids {sorted(done)}")
    if len(done) != len(set(done)):
        fail("an id is recorded done twice")
    files = sorted(os.listdir(os.path.join(out, "images")))
    if files != sorted(r["id"] + ".png" for r in rows):
        fail(f"images folder holds {files}")
    for d in (out, os.path.join(out, "images"), os.path.join(out, "store")):
        stray = [f for f in os.listdir(d) if ".tmp" in f]
        if stray:
            fail(f"temporary files left: {stray}")
    stores = os.listdir(os.path.join(out, "store"))
    print("HDF5 store files after the resume:", stores, flush=True)
    if len(stores) < 1:
        fail("no finished HDF5 store file")


def failed_request(tmp):
    model = tiny_model(tmp)
    rows = PROMPTS[:3] + [{"id": "bad-size", "prompt": "x", "height": 30}]
    out = os.path.join(tmp, "out")
    m = manifest(tmp, "job.toml", model, jsonl(os.path.join(tmp, "r.jsonl"), rows), out, tp=2)
    p = mpirun(2, "run", m, "--progress", "none", check=False)
    if p.returncode != 6:
        print(p.stdout)
        fail(f"exit code {p.returncode}, expected 6 (some requests failed)")
    recs = {r["id"]: r for r in results(out)}
    if recs["bad-size"]["status"] != "failed" or "height 30" not in recs["bad-size"]["error"]:
        fail(f"bad-size record {recs['bad-size']}")
    if any(recs[r["id"]]["status"] != "done" for r in rows[:3]):
        fail(f"records {recs}")
    # A rerun skips everything; --retry-failed runs the failed one again (and it fails again).
    p = mpirun(2, "run", m, "--progress", "none", check=False)
    if len(results(out)) != 4:
        fail("a rerun added records")
    p = mpirun(2, "run", m, "--progress", "none", "--retry-failed", check=False)
    recs = results(out)
    if len(recs) != 4 or [r["id"] for r in recs].count("bad-size") != 1:
        fail(f"after --retry-failed: {recs}")


def sigterm(tmp):
    model = tiny_model(tmp)
    rows = PROMPTS + [{"id": f"q{i}", "prompt": f"variation {i}"} for i in range(8)]
    out = os.path.join(tmp, "out")
    m = manifest(tmp, "job.toml", model, jsonl(os.path.join(tmp, "r.jsonl"), rows), out, tp=2, steps=8)
    status = os.path.join(tmp, "status.json")
    cmd = [MPIRUN, "-np", "2", "--oversubscribe", TPRUN, "run", m, "--progress", "none", "--status-file", status]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(os.path.join(out, "results.jsonl")) and results(out)):
        time.sleep(0.05)
    pids = subprocess.run(["pgrep", "-f", "-P", str(p.pid), "tprun"], stdout=subprocess.PIPE, text=True).stdout.split()
    for pid in pids:  # as Slurm does: every task gets SIGTERM
        os.kill(int(pid), signal.SIGTERM)
    text, _ = p.communicate(timeout=60)
    n = len(results(out))
    print(f"SIGTERM: exit {p.returncode}, {n} of {len(rows)} recorded", flush=True)
    if p.returncode != 75:
        print(text)
        fail(f"exit code {p.returncode}, expected 75")
    if n >= len(rows):
        fail("the job did not stop early")
    if json.load(open(status)).get("exit_code") != 75:
        fail(f"status file: {open(status).read()}")
    mpirun(2, "run", m, "--progress", "none", "--status-file", status)
    if json.load(open(status)) .get("exit_code") != 0:
        fail(f"status file after the resume: {open(status).read()}")
    done = [r["id"] for r in results(out) if r["status"] == "done"]
    if sorted(done) != sorted(r["id"] for r in rows):
        fail(f"after resume: {done}")


def rank_pids(parent):
    return subprocess.run(["pgrep", "-f", "-P", str(parent), "tprun"], stdout=subprocess.PIPE, text=True).stdout.split()


def wait_for_results(out, n, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(os.path.join(out, "results.jsonl")) and len(results(out)) >= n:
            return
        if proc.poll() is not None:
            print(proc.communicate()[0])
            fail("the job ended before writing results")
        time.sleep(0.05)
    proc.kill()
    fail("no results appeared")


def output_lock(tmp):
    """Two runs on one folder: the second is refused on every rank, naming the holder, and touches
    nothing (it used to remove the first's in-flight temporaries); a killed run leaves no stale lock."""
    model = tiny_model(tmp)
    rows = PROMPTS + [{"id": f"q{i}", "prompt": f"variation {i} of a garden"} for i in range(8)]
    out = os.path.join(tmp, "out")
    m = manifest(tmp, "job.toml", model, jsonl(os.path.join(tmp, "r.jsonl"), rows), out, tp=1, steps=500)
    first = subprocess.Popen([MPIRUN, "-np", "1", TPRUN, "run", m, "--progress", "none"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    wait_for_results(out, 1, first)
    p = mpirun(2, "run", m, "--progress", "none", check=False)
    holder = rank_pids(first.pid)
    want = f"output folder {out} in use by pid {holder[0] if holder else '?'} on {os.uname().nodename}"
    lines = [l for l in p.stdout.splitlines() if want in l]
    print(f"second run: exit {p.returncode}, {len(lines)} rank(s) named the holder", flush=True)
    if p.returncode != 3 or len(lines) != 2:
        print(p.stdout)
        fail(f"second run on a folder in use: exit {p.returncode}, expected 3 with {want!r} on both ranks")
    if "removing a temporary file" in p.stdout:
        fail("the refused run removed temporaries")
    for pid in rank_pids(first.pid):  # stop it after its current request (exit 75)
        os.kill(int(pid), signal.SIGTERM)
    text, _ = first.communicate(timeout=300)
    if first.returncode != 75:
        print(text)
        fail(f"the first run failed (exit {first.returncode}) next to the refused one")
    for r in results(out):  # nothing of the first run's was removed under it
        why = r["status"] == "done" and not os.path.exists(os.path.join(out, r["path"]))
        if why:
            fail(f"{r['id']}: recorded done, its image is gone")
    # A run killed outright (SIGKILL, no clean-up) leaves the lock file but no lock: the next run goes.
    os.remove(os.path.join(out, "results.jsonl"))
    killed = subprocess.Popen([MPIRUN, "-np", "1", TPRUN, "run", m, "--progress", "none"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    wait_for_results(out, 1, killed)
    for pid in rank_pids(killed.pid):
        os.kill(int(pid), signal.SIGKILL)
    killed.communicate(timeout=60)
    if not os.path.exists(os.path.join(out, ".tprun.lock")):
        fail("no lock file in the output folder")
    mpirun(2, "run", m, "--progress", "none", "--set", "defaults.steps=2")
    done = sorted(r["id"] for r in results(out) if r["status"] == "done")
    if done != sorted(r["id"] for r in rows):
        fail(f"after the killed run: {done}")
    # Chunks of a job array lock their own folders.
    for i in range(2):
        mpirun(1, "run", m, "--progress", "none", "--shard", f"{i}/2", "--set", "defaults.steps=2")
        if not os.path.exists(os.path.join(out, f"shard-{i}-of-2", ".tprun.lock")):
            fail(f"chunk {i}: no lock file in its folder")


def mount_small_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    return os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                                                stderr=subprocess.DEVNULL).returncode == 0


def disk_full(tmp):
    """Disk full while writing: an I/O error (exit 7) naming the path and the errno text, a log whose
    every line is a whole record, no temporaries; freeing space and rerunning finishes the job.
    `generate --out` into a full (or unwritable) folder fails before any compute."""
    model = tiny_model(tmp)
    rows = PROMPTS + [{"id": f"q{i}", "prompt": f"variation {i}"} for i in range(8)]
    small = os.path.join(tmp, "small")
    mounted = mount_small_tmpfs(small, "256k")
    limit = None
    if mounted:
        reason = "No space left on device"
        filler = os.path.join(small, "filler")
        with open(filler, "wb") as f:  # leave about 20 kB
            st = os.statvfs(small)
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - 20 * 1024))
    else:  # not root: a file size limit (tprun ignores SIGXFSZ, so writes fail with EFBIG)
        print("cannot mount a tmpfs here: using RLIMIT_FSIZE", flush=True)
        reason, filler, limit = "File too large", None, 1500
    try:
        out = os.path.join(small, "out")
        m = manifest(tmp, "job.toml", model, jsonl(os.path.join(tmp, "r.jsonl"), rows), out, tp=1)

        def limited():
            if limit:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

        cmd = [MPIRUN, "-np", "1", TPRUN, "run", m, "--progress", "none"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                           preexec_fn=limited)
        errors = [l for l in p.stdout.splitlines() if "I/O error" in l]
        print(f"full disk: exit {p.returncode}; {errors[:1]}", flush=True)
        if p.returncode != 7 or not errors or reason not in errors[0] or out not in errors[0]:
            print(p.stdout)
            fail(f"exit {p.returncode}: expected 7 with an I/O error naming a path under {out} and {reason!r}")
        log = os.path.join(out, "results.jsonl")
        if os.path.exists(log):
            data = open(log).read()
            if data and not data.endswith("\n"):
                fail("a half-written record stays in results.jsonl")
            before = [json.loads(l) for l in data.splitlines() if l.strip()]
            print(f"{len(before)} whole record(s) before the failure", flush=True)
            if len(before) >= len(rows):
                fail("the disk never filled up; make the tmpfs smaller")
        for d in (out, os.path.join(out, "images")):
            stray = [f for f in os.listdir(d) if ".tmp" in f] if os.path.isdir(d) else []
            if stray:
                fail(f"temporaries left: {stray}")
        if filler:
            os.remove(filler)
        limit = None
        mpirun(1, "run", m, "--progress", "none")
        done = [r["id"] for r in results(out) if r["status"] == "done"]
        if sorted(done) != sorted(r["id"] for r in rows) or len(done) != len(set(done)):
            fail(f"after freeing space: {done}")
        # generate --out is checked before any compute.
        if mounted:
            with open(os.path.join(small, "filler"), "wb", buffering=0) as f:
                for chunk in (65536, 4096, 1):  # every last page
                    try:
                        while True:
                            f.write(b"\0" * chunk)
                    except OSError:
                        pass
            target = os.path.join(small, "fox.png")
        else:
            target = "/proc/tprun-fox.png"
        p = mpirun(2, "generate", "--model", model, "--prompt", "a fox", "--height", "32", "--width", "32",
                   "--steps", "2", "--out", target, check=False)
        print(f"generate into a full folder: exit {p.returncode}", flush=True)
        if p.returncode != 7 or "I/O error" not in p.stdout or "step 1/" in p.stdout or "loaded " in p.stdout:
            print(p.stdout)
            fail("generate --out into an unwritable place: expected exit 7 before loading or computing")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", small])


def resume_incomplete(tmp):
    """Resume regenerates a PNG recorded done that is empty or truncated; a results log line that is
    someone's text (not the torn last line of an interrupted write) is an error and the file stays."""
    model = tiny_model(tmp)
    rows = PROMPTS[:4]
    out = os.path.join(tmp, "out")
    m = manifest(tmp, "job.toml", model, jsonl(os.path.join(tmp, "r.jsonl"), rows), out, tp=1)
    mpirun(2, "run", m, "--progress", "none")
    images = os.path.join(out, "images")
    ref = {r["id"]: pixels(os.path.join(images, r["id"] + ".png")) for r in rows}
    open(os.path.join(images, "p0.png"), "w").close()
    with open(os.path.join(images, "p1.png"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(images, "p1.png")) - 20)
    p = mpirun(2, "run", m, "--progress", "none")
    if "2 to run" not in p.stdout or p.stdout.count("is incomplete") != 2:
        print(p.stdout)
        fail("the empty and truncated PNGs recorded done were not run again")
    for r in rows:
        if int(np.abs(pixels(os.path.join(images, r["id"] + ".png")) - ref[r["id"]]).max()) != 0:
            fail(f"{r['id']}: the regenerated image differs")
    recs = results(out)
    if sorted(r["id"] for r in recs) != sorted(r["id"] for r in rows):
        fail(f"records after the resume: {[r['id'] for r in recs]}")
    # Someone's note in the middle of the log: refused, file untouched.
    log = os.path.join(out, "results.jsonl")
    lines = open(log).read().splitlines(True)
    text = "".join(lines[:2] + ["checked these by eye, all fine\n"] + lines[2:])
    write(log, text)
    p = mpirun(2, "run", m, "--progress", "none", check=False)
    named = [l for l in p.stdout.splitlines() if f"{log}:3: not a result record" in l]
    print(f"a note in the log: exit {p.returncode}, {len(named)} rank(s) named it", flush=True)
    if p.returncode != 3 or len(named) != 2:
        print(p.stdout)
        fail("a bad line inside results.jsonl was not refused on every rank")
    if open(log).read() != text:
        fail("results.jsonl was rewritten")
    # The torn last line of an interrupted writer is the one line dropped.
    write(log, "".join(lines) + '{"id": "p3", "sta')
    p = mpirun(2, "run", m, "--progress", "none")
    if "dropped its last line" not in p.stdout or len(results(out)) != len(rows):
        print(p.stdout)
        fail("the torn last line was not dropped")


def mpirun_sigterm_requeue(tmp):
    """slurm/single-node.sbatch with LAUNCHER=mpirun: SIGTERM to mpirun itself (mpirun then exits 1
    while tprun exits 75) still requeues, from tprun's status file; a finished run does not.
    One request takes many times mpirun's grace (TPRUN_STOP_GRACE=3: SIGTERM to the ranks 3 s after
    its own, SIGKILL 3 s later), on an idle machine as on a busy one: tprun must stop at the next
    denoise step and write its verdict at once, not after the request (that the grace allowed only
    while the machine was idle)."""
    model = tiny_model(tmp)
    rows = PROMPTS
    out = os.path.join(tmp, "out")
    # About 30 s a request on an idle machine (300 steps take ~1 s), minutes on a busy one.
    m = manifest(tmp, "job.toml", model, jsonl(os.path.join(tmp, "r.jsonl"), rows), out, tp=2, steps=10000)
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir)
    calls = os.path.join(tmp, "scontrol.calls")
    write(os.path.join(bin_dir, "scontrol"), f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    os.chmod(os.path.join(bin_dir, "scontrol"), 0o755)
    write(os.path.join(bin_dir, "mpirun"), f"#!/bin/sh\nexec {MPIRUN} --oversubscribe \"$@\"\n")
    os.chmod(os.path.join(bin_dir, "mpirun"), 0o755)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm", "single-node.sbatch")
    env = dict(os.environ, PATH=bin_dir + ":" + os.environ["PATH"], MANIFEST=m, TPRUN=os.path.abspath(TPRUN), LAUNCHER="mpirun",
               SLURM_JOB_ID="4242", SLURM_NTASKS="2", SLURM_JOB_NODELIST="localhost", SLURM_SUBMIT_DIR=tmp,
               TPRUN_ARGS="--progress none", OMPI_MCA_plm="rsh", OMPI_MCA_ras="^slurm",
               TPRUN_STOP_GRACE="3")  # mpirun: SIGTERM to the ranks 3 s after its own, SIGKILL 3 s later

    def sbatch():
        return subprocess.Popen(["bash", script], env=env, cwd=tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    job = sbatch()
    # The ranks are in the first request once the output folder exists (it is created after the load).
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.isdir(os.path.join(out, "images")) and job.poll() is None:
        time.sleep(0.05)
    if job.poll() is not None or not os.path.isdir(os.path.join(out, "images")):
        job.kill()
        print(job.communicate()[0])
        fail("the job did not start its requests")
    launcher = subprocess.run(["pgrep", "-f", "-P", str(job.pid), "mpirun"], stdout=subprocess.PIPE,
                              text=True).stdout.split()
    if not launcher:
        fail("mpirun not found under the batch script")
    os.kill(int(launcher[0]), signal.SIGTERM)
    text, _ = job.communicate(timeout=120)
    print(text)
    print(f"batch script: exit {job.returncode}", flush=True)
    requeued = open(calls).read() if os.path.exists(calls) else ""
    if len(results(out)) >= len(rows):
        fail("the job was not interrupted; make it heavier")
    if "requeue 4242" not in requeued:
        fail("SIGTERM to mpirun: the job was not requeued")
    os.remove(calls)
    env["TPRUN_ARGS"] = "--progress none --set defaults.steps=2"  # the rest, quickly
    job = sbatch()
    text, _ = job.communicate(timeout=300)
    print(f"second start: exit {job.returncode}", flush=True)
    if job.returncode != 0 or os.path.exists(calls):
        print(text)
        fail("the finished job exited non-zero or was requeued")
    if sorted(r["id"] for r in results(out) if r["status"] == "done") != sorted(r["id"] for r in rows):
        fail("not every request done after the requeue")


with tempfile.TemporaryDirectory() as tmp:
    {"bad_inputs": bad_inputs, "determinism": determinism, "resume_kill": resume_kill,
     "failed_request": failed_request, "sigterm": sigterm, "output_lock": output_lock, "disk_full": disk_full,
     "resume_incomplete": resume_incomplete, "mpirun_sigterm_requeue": mpirun_sigterm_requeue}[CASE](tmp)
print("OK", CASE)
