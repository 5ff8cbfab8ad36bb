#!/usr/bin/env python3
"""Staged phases of `tprun run` ([schedule] phases = "staged"): the same image bytes as "together"
(FLUX.1, FLUX.2 klein and dev; tp 1, tp 2, dp 2; rounds of stage_requests; batches), a kill or a
SIGTERM in each phase then a rerun (every id done once, the embedding cache reused), the cache rebuilt
when the text encoder's files change, and bad values of the new keys refused before any weight is read.

usage: staged_cases.py TPRUN MPIRUN CASE
CASE: same_bytes_flux | same_bytes_klein | same_bytes_dev | kill_encode | term_encode | kill_denoise |
      rebuild | bad_keys | tp_auto
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, jsonl, prompt_rows, read, results, run_cases, write_manifest  # noqa: E402

TPRUN, MPIRUN, CASE = sys.argv[1:4]
H = Harness(TPRUN, MPIRUN)


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def run_job(manifest, np_=1, sets=(), check=True):
    """(exit code, log) of `mpirun -np np_ tprun run MANIFEST --set ...`; a nonzero exit fails when `check`."""
    args = ["run", manifest, "--progress", "none"]
    for s in sets:
        args += ["--set", s]
    rc, log = H.run(args, np_=np_, timeout=600)
    if check and rc != 0:
        print(log[-4000:])
        fail(f"{' '.join(args)} (np {np_}): exit {rc}")
    return rc, log


def job(work, name, model, rows, tp=1, dp=0, schedule=None, output=None, defaults=None):
    """work/NAME.toml for `model` and `rows` (work/NAME.jsonl), output work/NAME-out; returns (manifest, out)."""
    out = os.path.join(work, name + "-out")
    tail = "".join(f"{k} = {v}\n" for k, v in (output or {}).items())
    if schedule:
        tail += "[schedule]\n" + "".join(f"{k} = {v}\n" for k, v in schedule.items())
    m = write_manifest(os.path.join(work, name + ".toml"), model, jsonl(os.path.join(work, name + ".jsonl"), rows),
                       out, parallel={"tp": tp, "dp": dp}, defaults=defaults, tail=tail)
    return m, out


def images(out):
    d = os.path.join(out, "images")
    return {f[:-4]: read(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".png")}


def encodes(log):
    """(run, saved) of the summary line 'prompt encodes: N run, M saved by ...'."""
    m = re.search(r"prompt encodes: (\d+) run, (\d+) saved", log)
    if not m:
        fail("no 'prompt encodes' summary line:\n" + log[-3000:])
    return int(m.group(1)), int(m.group(2))


def all_done_once(out, rows, what):
    recs = results(out)
    done = [r["id"] for r in recs if r["status"] == "done"]
    H.check(sorted(done) == sorted(r["id"] for r in rows) and len(done) == len(set(done)),
            f"{what}: every id done once ({len(done)} done records of {len(rows)})")


# Requests with a repeated prompt (one encode for both) and, where the family has one, true CFG.
def rows_for(arch):
    rows = prompt_rows(5)
    rows.append({"id": "again", "prompt": rows[0]["prompt"], "seed": 77})
    if arch == "flux":
        rows.append({"id": "cfg", "prompt": "a green door", "negative_prompt": "blurry", "true_cfg_scale": 2.0})
    return rows


def same_bytes(work, arch):
    """Staged makes the bytes "together" makes with the same mesh and batch size (tp 2 and batches may
    differ from tp 1 in the last bits; staged must not differ from its own together)."""
    model = H.init_model(work, arch)
    rows = rows_for(arch)
    defaults = {"guidance": 4.0} if arch == "flux2-klein" else None  # klein: true CFG with the empty negative
    runs = [("tp 1, rounds of 2", 1, dict(tp=1), {"stage_requests": 2}, None),
            ("tp 2", 2, dict(tp=2), {}, None),
            ("dp 2, batches of 2", 2, dict(tp=1, dp=2), {}, {"batch_size": 2})]
    distinct = len({(r["prompt"]) for r in rows}) + (1 if arch == "flux" else 0) + (1 if arch == "flux2-klein" else 0)
    for what, np_, par, sched, output in runs:
        name = re.sub(r"\W+", "_", what)
        ref_m, ref_out = job(work, "together_" + name, model, rows, schedule={"phases": '"together"'}, output=output,
                             defaults=defaults, **par)
        run_job(ref_m, np_=np_)
        ref = images(ref_out)
        H.check(len(ref) == len(rows), f"{arch} together {what}: {len(ref)} images")
        m, out = job(work, "staged_" + name, model, rows, schedule=dict(sched, phases='"staged"'), output=output,
                     defaults=defaults, **par)
        _, log = run_job(m, np_=np_)
        got = images(out)
        same = sorted(got) == sorted(ref) and all(got[k] == ref[k] for k in ref)
        H.check(same, f"{arch} staged {what}: PNG bytes identical to together"
                + ("" if same else f" (differ: {[k for k in ref if got.get(k) != ref[k]]})"))
        run, saved = encodes(log)
        if "dp 2" not in what:  # dp: each replica encodes its own share
            # Rounds: a prompt met again in a later round is read back from the cache.
            H.check(run == distinct and (saved == 0 or "rounds" in what),
                    f"{arch} staged {what}: {run} distinct texts encoded (want {distinct}), {saved} reused")
        else:
            H.check(run >= distinct and run + saved >= distinct, f"{arch} staged {what}: {run} encoded, {saved} reused")
        all_done_once(out, rows, f"{arch} staged {what}")
        H.check("transformer and VAE" in log and "text encoders" in log, f"{arch} {what}: the two phases loaded apart")


def watch_and_signal(cmd, trigger, sig, after_lines=0):
    """Starts `cmd`; when a line matching `trigger` appears (after `after_lines` matches), sends `sig` to
    every rank; returns (exit code, log)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, seen, sent = [], 0, False
    deadline = time.time() + 300
    for line in p.stdout:
        lines.append(line)
        if not sent and re.search(trigger, line):
            seen += 1
            if seen > after_lines:
                pids = subprocess.run(["pgrep", "-f", "-P", str(p.pid), "tprun"], stdout=subprocess.PIPE,
                                      text=True).stdout.split()
                for pid in pids:
                    os.kill(int(pid), sig)
                sent = True
                lines.append(f"### test: sent signal {sig} to {pids}\n")
        if time.time() > deadline:
            p.kill()
            break
    p.wait(timeout=120)
    return p.returncode, "".join(lines)


# 48 prompts; klein's tiny model runs true CFG, so the empty negative prompt makes 49 texts.
def many_rows(n):
    return [{"id": f"q{i}", "prompt": f"variation {i} of a garden with a long description " * 3} for i in range(n)]


def interrupted_then_rerun(work, sig, trigger, after_lines, label, want_reused_after):
    model = H.init_model(work, "flux2-klein")
    rows = many_rows(48)
    defaults = {"max_sequence_length": 256}
    m, out = job(work, "job", model, rows, tp=2, schedule={"phases": '"staged"'}, defaults=defaults)
    cmd = [MPIRUN, "--oversubscribe", "-np", "2", TPRUN, "run", m, "--progress", "none", "--log-dir", ""]
    rc, log = watch_and_signal(cmd, trigger, sig, after_lines)
    H.check(rc != 0, f"{label}: the interrupted run exits {rc}")
    if sig == signal.SIGTERM:
        H.check(rc == 75, f"{label}: SIGTERM exit code {rc} (want 75)")
    before = len(results(out)) if os.path.exists(os.path.join(out, "results.jsonl")) else 0
    H.check(before < len(rows), f"{label}: {before} of {len(rows)} recorded before the rerun")
    _, log2 = run_job(m, np_=2)
    run, saved = encodes(log2)
    H.check(want_reused_after(run, saved), f"{label}: the rerun encoded {run} and reused {saved} texts")
    all_done_once(out, rows, label)
    return log, log2


def first_encoded(log):
    """Texts the interrupted run wrote to the cache: its 'N text(s) encoded' lines (0 when the signal came
    before any chunk was written)."""
    return sum(int(n) for n in re.findall(r"(\d+) text\(s\) encoded", log))


# Where exactly a signal lands depends on the machine's speed; the checks hold wherever it lands: what
# the interrupted run wrote to the cache is what the rerun reuses, and every text is encoded once overall.
def kill_encode(work):
    log, log2 = interrupted_then_rerun(work, signal.SIGKILL, r"loaded .*: text encoders", 0,
                                       "SIGKILL in the encode phase", lambda run, saved: run + saved == 49)
    written = first_encoded(log)
    run, saved = encodes(log2)
    H.check(saved == written, f"SIGKILL in the encode phase: the rerun reused the {written} text(s) the killed run "
            f"wrote (reused {saved})")


def term_encode(work):
    log, log2 = interrupted_then_rerun(work, signal.SIGTERM, r"loaded .*: text encoders", 0,
                                       "SIGTERM in the encode phase", lambda run, saved: run + saved == 49)
    written = first_encoded(log)
    run, saved = encodes(log2)
    H.check(saved == written, f"SIGTERM: the rerun reused the {written} text(s) the stopped run wrote (reused {saved})")
    where = "in the encode phase" if "stopping in the encode phase" in log else "after the encode phase"
    H.check("replica(s) stopped early" in log, f"SIGTERM: the run stopped ({where}) and said so")


def kill_denoise(work):
    log, log2 = interrupted_then_rerun(work, signal.SIGKILL, r"loaded .*: transformer and VAE", 0,
                                       "SIGKILL in the denoise phase", lambda run, saved: run == 0 and saved == 49)


def rebuild(work):
    """The cache is reused by a rerun of the same model, and rebuilt (a new fingerprint folder) when a
    text encoder file changes."""
    model = H.init_model(work, "flux2-klein")
    rows = prompt_rows(3)
    m, out = job(work, "job", model, rows, schedule={"phases": '"staged"'})
    _, log = run_job(m)
    # klein's tiny model runs true CFG: the empty negative prompt is one more text.
    H.check(encodes(log) == (4, 0), f"first run: {encodes(log)} (want 3 prompts + the negative encoded)")
    jsonl(os.path.join(work, "job.jsonl"), rows + [{"id": "more", "prompt": rows[0]["prompt"], "seed": 9}])
    _, log = run_job(m)
    H.check(encodes(log) == (0, 2), f"new request, same prompt, same model: {encodes(log)} (want 0 encoded, 2 reused)")
    folders_before = os.listdir(os.path.join(out, "embeddings"))
    weights = [os.path.join(model, "text_encoder", f) for f in os.listdir(os.path.join(model, "text_encoder"))
               if f.endswith(".safetensors")]
    with open(weights[0], "r+b") as f:  # one weight changed (the last byte of the data)
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x01]))
    jsonl(os.path.join(work, "job.jsonl"), rows + [{"id": "more", "prompt": rows[0]["prompt"], "seed": 9},
                                                   {"id": "again", "prompt": rows[1]["prompt"], "seed": 10}])
    _, log = run_job(m)
    H.check(encodes(log) == (2, 0), f"text encoder file changed: {encodes(log)} (want 2 encoded: the new request's prompt and negative)")
    folders = os.listdir(os.path.join(out, "embeddings"))
    H.check(len(folders) == len(folders_before) + 1, f"a new fingerprint folder: {folders_before} -> {folders}")


def bad_keys(work):
    model = H.init_model(work, "flux")
    rows = prompt_rows(2)
    m, _ = job(work, "job", model, rows)
    for sets, want in [(['schedule.phases="sometimes"'], "schedule.phases: 'sometimes' is not one of auto, together, staged"),
                       (["schedule.stage_requests=-1"], "schedule.stage_requests"),
                       (['schedule.stage_requests="all"'], "schedule.stage_requests"),
                       (["schedule.stages=2"], "schedule.stages"),
                       (['schedule.device_memory="lots"'], "schedule.device_memory"),
                       (["schedule.device_memory=-5"], "schedule.device_memory"),
                       (['parallel.tp="most"'], "parallel.tp"),
                       (['parallel.tp="auto"', "parallel.dp=2"], "parallel.tp = \"auto\" chooses dp too")]:
        args = ["run", m, "--progress", "none"]
        for s in sets:
            args += ["--set", s]
        H.expect_config_error(f"bad key {' '.join(sets)}", args, want, np_=2, absent="loaded ")


def tp_auto(work):
    """parallel.tp = "auto" runs the plan `tprun plan` prints for the same manifest and world, and
    phases = "auto" runs together where the plan says together fits at that tp, staged where only staged
    does; nothing fitting is an error before any weight is read."""
    model = H.init_model(work, "flux2-klein")
    rows = prompt_rows(4)
    m, out = job(work, "job", model, rows, tp='"auto"')

    def plan(np_, memory):
        r = subprocess.run([TPRUN, "plan", m, "--world", str(np_), "--device-memory", str(memory), "--json"],
                           capture_output=True, text=True)
        return json.loads(r.stdout) if r.stdout.strip() else None

    big = plan(2, "64GB")
    if big is None:
        fail("tprun plan printed no JSON")
    peaks = {(c["tp"], c["stages"]): c["checked_peak"] for c in big["candidates"]}
    # Between the staged and the together peak of tp 1: only staged fits.
    between = (peaks[(1, "staged")] + peaks[(1, "together")]) // 2
    H.check(peaks[(1, "staged")] < peaks[(1, "together")], f"staged peak {peaks[(1, 'staged')]} < together "
            f"{peaks[(1, 'together')]}")
    for np_, memory in [(2, "64GB"), (2, str(between)), (2, "1MB")]:
        p = plan(np_, memory)
        rc, log = H.run(["run", m, "--progress", "none", "--set", f"output.dir={out}-{np_}-{memory}",
                         "--set", f'schedule.device_memory="{memory}"'], np_=np_, timeout=600)
        if p is None or not p.get("chosen"):
            H.check(rc == 3 and "no plan fits" in log and "loaded " not in log,
                    f"nothing fits {memory}: run exit {rc}, before any weight")
            continue
        c = p["chosen"]
        together = [x for x in p["candidates"] if x["tp"] == c["tp"] and x["stages"] == "together"]
        stages = "together" if together and together[0]["fits"] else "staged"
        H.check(c["auto_stages"] == stages, f"plan --json auto_stages {c['auto_stages']} (together fits: {stages})")
        want = f'schedule.phases = "auto" ({stages})'
        mesh = f"tp {c['tp']} x dp {c['dp']}"
        H.check(rc == 0 and mesh in log and want in log,
                f"tp auto, world {np_}, {memory}: the run uses the plan's {mesh} and {stages}"
                + ("" if rc == 0 else "\n" + log[-2000:]))
        if memory == str(between):
            H.check(stages == "staged" and "transformer and VAE" in log, f"{memory} bytes: staged, as only it fits")


CASES = {"same_bytes_flux": lambda w: same_bytes(w, "flux"), "same_bytes_klein": lambda w: same_bytes(w, "flux2-klein"),
         "same_bytes_dev": lambda w: same_bytes(w, "flux2-dev"), "kill_encode": kill_encode, "term_encode": term_encode,
         "kill_denoise": kill_denoise, "rebuild": rebuild, "bad_keys": bad_keys, "tp_auto": tp_auto}

if __name__ == "__main__":
    sys.exit(run_cases(H, CASES, "staged"))
