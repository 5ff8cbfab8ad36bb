#!/usr/bin/env python3
"""The sbatch scripts in slurm/ against a real local Slurm (tools/slurm-local.sh).

usage: slurm_cases.py TPRUN CASE
CASE: up | srun_2 | srun_4 | mpirun | multi_node | array | requeue | killed_rank | mpirun_sigterm | down

`up` brings the cluster up and writes a tiny model (tprun init-model) into the
work folder; `down` tears the cluster down. The cases submit the demo manifest
(jobs/demo.toml: 12 prompts, tp 2) through the scripts and check results.jsonl:
every request `done` exactly once. Jobs are polled with `scontrol show job`
(there is no slurmdbd), each with a timeout, since a job asking for more CPUs
than the node has would pend forever.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORK = os.environ.get("TPRUN_SLURM_TEST_DIR", "/tmp/tprun-slurm-tests")
MODEL = os.path.join(WORK, "model")
MANIFEST = os.path.join(ROOT, "jobs", "demo.toml")
IDS = [json.loads(l)["id"] for l in open(os.path.join(ROOT, "jobs", "demo-prompts.jsonl")) if l.strip()]
TPRUN, CASE = os.path.abspath(sys.argv[1]), sys.argv[2]


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def sh(cmd, env=None, check=True, timeout=120):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout)
    if check and p.returncode != 0:
        print(p.stdout)
        fail(f"{' '.join(cmd)} exited {p.returncode}")
    return p.stdout


def slurm_env():
    out = sh(["bash", os.path.join(ROOT, "tools", "slurm-local.sh"), "env"]).strip().splitlines()[-1]
    m = re.match(r"export SLURM_CONF=(\S+)", out)
    if not m:
        fail(f"tools/slurm-local.sh env printed {out!r}")
    env = dict(os.environ, SLURM_CONF=m.group(1), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def fresh(case_dir):
    """A case starts from an empty folder (no results of an earlier run to resume)."""
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(case_dir)
    return case_dir


def submit(env, case_dir, script, *sbatch_args, **variables):
    os.makedirs(case_dir, exist_ok=True)
    exports = ",".join(["ALL", f"MANIFEST={MANIFEST}", f"TPRUN={TPRUN}"] + [f"{k}={v}" for k, v in variables.items()])
    cmd = ["sbatch", "--parsable", "-D", case_dir, "--output", os.path.join(case_dir, "slurm-%j.out"),
           f"--export={exports}", *sbatch_args, os.path.join(ROOT, "slurm", script)]
    print("+", " ".join(cmd), flush=True)
    jid = sh(cmd, env=env).strip().split(";")[0]
    print("job", jid, flush=True)
    return jid


def job_states(env, jid):
    """{job id: (state, exit code, restarts)} for the job (every task of an array)."""
    out = sh(["scontrol", "-o", "show", "job", jid], env=env, check=False)
    states = {}
    for line in out.splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if "JobId" in f:
            states[f["JobId"]] = (f.get("JobState"), f.get("ExitCode"), int(f.get("Restarts", "0")))
    return states


def wait(env, jid, timeout=240, want=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = job_states(env, jid)
        if st and all(s[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
                      for s in st.values()):
            if want is not None and want not in st:
                pass
            return st
        time.sleep(0.5)
    sh(["scancel", jid], env=env, check=False)
    fail(f"job {jid} did not finish within {timeout} s: {job_states(env, jid)}")


def results(out):
    path = os.path.join(out, "results.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.endswith("\n") and l.strip()]


def check_all_done(out):
    recs = results(out)
    done = [r["id"] for r in recs if r["status"] == "done"]
    if sorted(done) != sorted(IDS) or len(done) != len(set(done)):
        fail(f"{out}: done ids {sorted(done)}")
    missing = [i for i in IDS if not os.path.exists(os.path.join(out, "images", i + ".png"))]
    if missing:
        fail(f"{out}: no image for {missing}")
    print(f"{out}: all {len(IDS)} requests done exactly once", flush=True)


def args(out, extra=""):
    # The demo manifest says dp 2; dp 0 = "tasks / tp" fits any task count.
    return f"--set model=\"{MODEL}\" --set parallel.dp=0 --out {out} --progress log --log-dir {out}/logs {extra}".strip()


def expect_completed(st, jid):
    if st.get(jid, (None,))[0] != "COMPLETED" or st[jid][1] != "0:0":
        fail(f"job {jid}: {st}")


def up():
    sh(["bash", os.path.join(ROOT, "tools", "slurm-local.sh"), "up"], timeout=300)
    env = slurm_env()
    print(sh(["sinfo"], env=env), flush=True)
    shutil.rmtree(WORK, ignore_errors=True)  # nothing of an earlier run (this tprun writes the model)
    os.makedirs(WORK)
    sh([TPRUN, "init-model", MODEL, "--arch", "flux", "--preset", "tiny"])


def srun_n(n):
    env = slurm_env()
    d = fresh(os.path.join(WORK, f"srun_{n}"))
    out = os.path.join(d, "out")
    jid = submit(env, d, "single-node.sbatch", f"--ntasks-per-node={n}", TPRUN_ARGS=args(out))
    expect_completed(wait(env, jid), jid)
    check_all_done(out)


def mpirun_inside():
    env = slurm_env()
    d = fresh(os.path.join(WORK, "mpirun"))
    out = os.path.join(d, "out")
    jid = submit(env, d, "single-node.sbatch", "--ntasks-per-node=2", TPRUN_ARGS=args(out), LAUNCHER="mpirun")
    expect_completed(wait(env, jid), jid)
    check_all_done(out)
    log = open(os.path.join(out, "logs", "rank-0001.log")).read() if os.path.exists(
        os.path.join(out, "logs", "rank-0001.log")) else ""
    print("rank 1 saw its environment from:", re.findall(r"environment from (\S+)", log)[:1], flush=True)


def multi_node():
    env = slurm_env()
    d = fresh(os.path.join(WORK, "multi_node"))
    out = os.path.join(d, "out")
    jid = submit(env, d, "multi-node.sbatch", "--nodes=1", "--ntasks-per-node=4", TPRUN_ARGS=args(out), TP="2")
    expect_completed(wait(env, jid), jid)
    check_all_done(out)
    # A TP size that does not divide the tasks per node is refused before launch.
    bad = submit(env, d, "multi-node.sbatch", "--nodes=1", "--ntasks-per-node=4", TPRUN_ARGS=args(out), TP="3")
    st = wait(env, bad)
    text = open(os.path.join(d, f"slurm-{bad}.out")).read()
    if st[bad][0] != "FAILED" or "TP=3 must divide the 4 tasks per node" not in text:
        fail(f"TP=3: {st} {text}")


def array():
    env = slurm_env()
    d = fresh(os.path.join(WORK, "array"))
    out = os.path.join(d, "out")
    jid = submit(env, d, "array.sbatch", "--array=0-2", "--ntasks=2", TPRUN_ARGS=args(out))
    st = wait(env, jid)
    if len(st) != 3 or any(s[0] != "COMPLETED" for s in st.values()):
        fail(f"array tasks: {st}")
    chunks = sorted(os.path.join(out, c) for c in os.listdir(out) if c.startswith("shard-"))
    if len(chunks) != 3:
        fail(f"chunks {chunks}")
    merged = os.path.join(d, "merged")
    print(sh([TPRUN, "merge-results", "--out", merged, *chunks]), flush=True)
    check_all_done(merged)


def requeue():
    env = slurm_env()
    d = fresh(os.path.join(WORK, "requeue"))
    out = os.path.join(d, "out")
    jid = submit(env, d, "single-node.sbatch", "--ntasks-per-node=2",
                 TPRUN_ARGS=args(out, "--set defaults.steps=150"))
    deadline = time.time() + 120
    while time.time() < deadline and len(results(out)) < 2:
        time.sleep(0.2)
    before = len(results(out))
    if before >= len(IDS):
        fail("the batch finished before the requeue")
    print(f"requeueing {jid} after {before} results", flush=True)
    sh(["scontrol", "requeue", jid], env=env)
    deadline = time.time() + 240
    while time.time() < deadline:
        st = job_states(env, jid)
        if st.get(jid, (None, None, 0))[2] >= 1 and st[jid][0] in ("COMPLETED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.5)
    st = job_states(env, jid)
    print("after the requeue:", st, flush=True)
    expect_completed(st, jid)
    if st[jid][2] < 1:
        fail("the job was not restarted")
    check_all_done(out)
    logs = "".join(open(os.path.join(d, f)).read() for f in os.listdir(d) if f.startswith("slurm-"))
    if "restart 1" not in logs:
        fail("SLURM_RESTART_COUNT 1 not logged")


def killed_rank():
    env = slurm_env()
    d = fresh(os.path.join(WORK, "killed_rank"))
    out = os.path.join(d, "out")
    jid = submit(env, d, "single-node.sbatch", "--ntasks-per-node=2", "--no-requeue",
                 TPRUN_ARGS=args(out, "--set defaults.steps=150"))
    deadline = time.time() + 120
    while time.time() < deadline and not results(out):
        time.sleep(0.2)
    pids = sh(["pgrep", "-f", f"tprun run .*{out}"], check=False).split()
    if not pids:
        fail("no tprun process found")
    t0 = time.time()
    os.kill(int(pids[-1]), signal.SIGKILL)
    while time.time() - t0 < 60 and job_states(env, jid).get(jid, ("RUNNING",))[0] in ("RUNNING", "COMPLETING"):
        time.sleep(0.1)
    took = time.time() - t0
    st = job_states(env, jid)
    print(f"job state {st[jid]} {took:.1f} s after SIGKILL of one rank", flush=True)
    if st[jid][0] != "FAILED" or took > 15:
        fail(f"a killed rank did not end the job promptly: {st} after {took:.1f} s")
    left = sh(["pgrep", "-f", f"tprun run .*{out}"], check=False).split()
    if left:
        fail(f"tprun processes left: {left}")


def mpirun_sigterm():
    """LAUNCHER=mpirun and SIGTERM to mpirun itself: mpirun exits 1 while tprun exits 75; the script
    reads tprun's status file, requeues, and the next start completes the batch. Many light requests:
    mpirun passes SIGTERM on TPRUN_STOP_GRACE s after its own, so the batch must outlast that."""
    env = slurm_env()
    d = fresh(os.path.join(WORK, "mpirun_sigterm"))
    out = os.path.join(d, "out")
    ids = [f"r{i}" for i in range(400)]
    requests = os.path.join(d, "many.jsonl")
    with open(requests, "w") as f:
        f.writelines(json.dumps({"id": i, "prompt": f"variation {i} of a lighthouse"}) + "\n" for i in ids)
    jid = submit(env, d, "single-node.sbatch", "--ntasks-per-node=2", "--open-mode=append", LAUNCHER="mpirun",
                 TPRUN_STOP_GRACE="3", TPRUN_ARGS=args(out, f"--set requests=\"{requests}\" --set defaults.steps=20"))
    deadline = time.time() + 120
    while time.time() < deadline and len(results(out)) < 1:
        time.sleep(0.1)
    pids = sh(["pgrep", "-f", f"^mpirun .*run .*{out}"], check=False).split()
    if not pids or len(results(out)) >= len(ids):
        fail(f"no running mpirun found ({pids}) or the batch finished already")
    print(f"SIGTERM to mpirun {pids[0]} after {len(results(out))} results", flush=True)
    os.kill(int(pids[0]), signal.SIGTERM)
    deadline = time.time() + 300
    while time.time() < deadline:
        st = job_states(env, jid)
        if st.get(jid, (None, None, 0))[0] in ("COMPLETED", "FAILED", "CANCELLED"):
            break  # finished: after a requeue (Restarts >= 1) or without one (the script requeues before it exits)
        time.sleep(0.5)
    st = job_states(env, jid)
    print("after SIGTERM to mpirun:", st, flush=True)
    logs = "".join(open(os.path.join(d, f)).read() for f in os.listdir(d) if f.startswith("slurm-"))
    if st.get(jid, (None, None, 0))[2] < 1:
        print("\n".join(l for l in logs.splitlines() if l.startswith("tprun:")))
        fail("the job was not requeued")
    expect_completed(st, jid)
    done = [r["id"] for r in results(out) if r["status"] == "done"]
    if sorted(done) != sorted(ids) or len(done) != len(set(done)):
        fail(f"after the requeue: {len(done)} done of {len(ids)}")
    if "the launcher exited 1, tprun 75" not in logs:
        print(logs)
        fail("the script did not take tprun's exit code over mpirun's")

def down():
    sh(["bash", os.path.join(ROOT, "tools", "slurm-local.sh"), "down"], timeout=120)


{"up": up, "srun_2": lambda: srun_n(2), "srun_4": lambda: srun_n(4), "mpirun": mpirun_inside,
 "multi_node": multi_node, "array": array, "requeue": requeue, "killed_rank": killed_rank, "mpirun_sigterm": mpirun_sigterm,
 "down": down}[CASE]()
print("OK", CASE)
