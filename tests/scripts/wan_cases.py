#!/usr/bin/env python3
"""WanPipeline's hostile input, its staged experts in a job and its component commands (issue 33).

usage: wan_cases.py TPRUN MPIRUN CASE        (one ctest entry a case, tests/CMakeLists.txt's Wan section)

Every folder is `tprun init-model --arch wan | wan-a14b` (tiny, random weights), edited where a case says.
Cases:
  folders   `generate` on an edited folder at np 2 is refused with the exit code of its kind (4: a checkpoint
            folder's file, 3: a request), the message naming the file and the field on both ranks, before any
            weight byte is read: model_index.json boundary_ratio 1.5 / "0.875" / true; transformer_2 without
            boundary_ratio; expand_timesteps true; transformer_2's in_channels / text_dim not transformer's;
            text_dim not the UMT5 d_model; in_channels not the VAE's z_dim; a bad UniPC value (solver_order 0,
            solver_type "bh3", flow_shift -1) in scheduler_config.json; frames past what rope_max_seq_len covers
            in an edited transformer/config.json (named in the message).
  requests  request keys WanPipeline refuses, each with its field named: through `generate` at np 2 (exit 3 on
            both ranks) and as requests of one job beside a good one (each failed in results.jsonl naming the
            field, the good one done, exit 6): frames 6 (not 4k + 1), frames 4097 (the bound), an odd height
            and width 40 (not multiples of 16) for mp4, guidance_2 on a Wan 2.1 folder (no second expert).
  memory    a job under `ulimit -v 4 GiB` whose request of 4093 frames at 480 x 832 cannot fit: failed with the
            estimate naming its frames (counted in the estimate: one frame would fit) and no step run, the
            small request done, exit 6, at tp 1 and tp 2.
  experts   jobs/wan-demo.toml on a `wan-a14b` folder (frames PNGs, stage_requests 2) with schedule.experts
            "resident" and "staged" at dp 1 x tp 2 and dp 2 x tp 1: every request done, every frame PNG the
            same bytes in all four runs, the staged runs swap experts (one held at a time); a rerun has nothing
            to run; a staged run stopped by SIGTERM in its second round exits 75 and its resume completes with
            the same bytes; "auto" picks resident where both fit (its log line).
  plan      `tprun plan --frames 81 --stage-experts` against the same plan without, on the tiny wan-a14b folder
            and on a sparse real-size Wan 2.2 A14B (tools/make_sparse_pipeline.py, bf16, 8 x 80 GiB): every candidate's
            denoise and decode phases smaller by exactly one expert's bytes on the rank (transformer_2's
            safetensors tensors, split over tp); the JSON names the frames and experts planned.
  components `tprun forward --component transformer | text_encoder | vae_decoder` on the Wan pipeline folder
            (diffusers' argument names: hidden_states [B, C, F, H, W], timestep, encoder_hidden_states;
            input_ids, attention_mask; z) against diffusers' / transformers' classes
            within 1e-4 at tp 1 and 2, and `tprun verify --tp 2` on the folder.
"""
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, jsonl, read, results, run_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "jobs", "wan-demo.toml")
WEIGHTS_READ = "bytes on this rank"  # a pipeline's load line: a weight was read
PROMPT = "a red fox trotting through fresh snow"
H = None


def edit_json(path, fn):
    with open(path) as f:
        data = json.load(f)
    fn(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def folder(work, arch, name=None):
    """A tiny `init-model --arch ARCH` folder under work (written once, then reused)."""
    d = os.path.join(work, name or arch)
    if not os.path.isdir(d):
        r = subprocess.run([H.tprun, "init-model", d, "--arch", arch], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"FAIL: init-model --arch {arch}: {r.stderr[-1000:]}")
    return d


def edited(work, arch, label, edits):
    """A copy of the `arch` folder with edits {relative json path: fn(json)} applied."""
    dst = os.path.join(work, "edit-" + "".join(c if c.isalnum() else "-" for c in label))
    shutil.copytree(folder(work, arch), dst)
    for rel, fn in edits.items():
        edit_json(os.path.join(dst, rel), fn)
    return dst


def refused(label, model, want, code, extra=(), np_=2, out="never.mp4"):
    """`generate` on `model` refused with `code` on all np_ ranks, each line naming every string of `want`,
    and no weight read."""
    work = os.path.dirname(model)
    base = {"--height": "64", "--width": "64", "--frames": "5", "--steps": "2"}
    args = [a for k, v in base.items() if k not in extra for a in (k, v)]
    rc, log = H.run(["generate", "--model", model, "--prompt", PROMPT, *args, "--out", os.path.join(work, out),
                     *extra], np_=np_, timeout=120)
    want = [want] if isinstance(want, str) else want
    lines = [ln for ln in log.splitlines() if all(w in ln for w in want)]
    ok = rc == code and len(lines) >= np_ and WEIGHTS_READ not in log
    # Exit 6 (a RequestError) is the check after the load (generate's "loaded" line comes after it).
    when = "no weight read" if code != 6 else "after the load, before any step"
    return H.check(ok, f"{label}: exit {rc} (want {code}), {want} on {len(lines)} of {np_} ranks, {when}"
                   + (f"\n    {lines[0].strip()[:400]}" if lines else "") + ("" if ok else f"\n{log[-1500:]}"))


def idx(fn):
    return {"model_index.json": fn}


# ---- folders -------------------------------------------------------------------------------------------

def case_folders(work):
    # (label, arch, edits, [strings every error line must hold], exit code)
    cases = [
        ("boundary_ratio 1.5", "wan-a14b", idx(lambda j: j.update(boundary_ratio=1.5)),
         ["model_index.json", "boundary_ratio", "1.5"], 4),
        ("boundary_ratio a string", "wan-a14b", idx(lambda j: j.update(boundary_ratio="0.875")),
         ["model_index.json", "boundary_ratio", '"0.875"'], 4),
        ("boundary_ratio true", "wan-a14b", idx(lambda j: j.update(boundary_ratio=True)),
         ["model_index.json", "boundary_ratio", "true"], 4),
        ("boundary_ratio 0", "wan-a14b", idx(lambda j: j.update(boundary_ratio=0)),
         ["model_index.json", "boundary_ratio"], 4),
        ("transformer_2 without boundary_ratio", "wan-a14b", idx(lambda j: j.pop("boundary_ratio")),
         ["model_index.json", "transformer_2", "boundary_ratio"], 4),
        ("boundary_ratio without transformer_2", "wan", idx(lambda j: j.update(boundary_ratio=0.875)),
         ["model_index.json", "boundary_ratio", "transformer_2"], 4),
        ("expand_timesteps true", "wan", idx(lambda j: j.update(expand_timesteps=True)),
         ["model_index.json", "expand_timesteps"], 4),
        ("transformer_2 in_channels", "wan-a14b",
         {"transformer_2/config.json": lambda j: j.update(in_channels=32)},
         ["transformer_2", "config.json", "in_channels 32", "16"], 4),
        ("transformer_2 text_dim", "wan-a14b",
         {"transformer_2/config.json": lambda j: j.update(text_dim=j["text_dim"] * 2)},
         ["transformer_2", "config.json", "text_dim"], 4),
        ("text_dim != UMT5 d_model", "wan", {"transformer/config.json": lambda j: j.update(text_dim=j["text_dim"] * 2)},
         ["transformer", "config.json", "text_dim", "d_model", "text_encoder"], 4),
        ("in_channels != VAE z_dim", "wan",
         {"transformer/config.json": lambda j: j.update(in_channels=8, out_channels=8)},
         ["transformer", "config.json", "in_channels", "z_dim", "vae"], 4),
        ("UniPC solver_order 0", "wan", {"scheduler/scheduler_config.json": lambda j: j.update(solver_order=0)},
         ["scheduler_config.json", "solver_order"], 4),
        ("UniPC solver_type bh3", "wan", {"scheduler/scheduler_config.json": lambda j: j.update(solver_type="bh3")},
         ["scheduler_config.json", "solver_type", "bh3"], 4),
        ("UniPC flow_shift -1", "wan", {"scheduler/scheduler_config.json": lambda j: j.update(flow_shift=-1.0)},
         ["scheduler_config.json", "flow_shift"], 4),
    ]
    for label, arch, edits, want, code in cases:
        refused(label, edited(work, arch, label, edits), want, code)
    # rope_max_seq_len 3: three latent frames at most, so 9 frames; 13 is refused naming why.
    short = edited(work, "wan", "rope 3", {"transformer/config.json": lambda j: j.update(rope_max_seq_len=3)})
    refused("frames 13 past rope_max_seq_len 3", short, ["frames", "13", "9 frames", "rope_max_seq_len",
                                                          "transformer/config.json"], 3,
            extra=("--frames", "13"))


# ---- requests ------------------------------------------------------------------------------------------

BAD_REQUESTS = [  # (id, request keys, strings the error names, generate flags, generate's exit code)
    # Checked before the load: a ConfigError (3). A size not a multiple of 16 (the VAE's 8 x the 2 x 2 patch)
    # is the shared latent check after the load: a RequestError (6), as for every family.
    ("frames6", {"frames": 6}, ["frames", "6", "4 x k + 1"], ("--frames", "6"), 3),
    ("odd", {"height": 65, "width": 63}, ["65"], ("--height", "65", "--width", "63"), 3),
    ("w40", {"width": 40}, ["width", "40", "16"], ("--width", "40"), 6),
    ("guidance2", {"guidance_2": 3.0}, ["guidance_2", "transformer_2"], ("--guidance-2", "3"), 3),
]


def case_requests(work):
    d = folder(work, "wan")
    refused("generate --frames 4097", d, ["frames", "4097"], 3, extra=("--frames", "4097"))
    for rid, _, want, flags, code in BAD_REQUESTS:
        refused(f"generate {' '.join(flags)}", d, want + (["--out", "MP4"] if rid == "odd" else []), code,
                extra=flags)
    rows = [{"id": "good", "prompt": PROMPT}] + [dict({"id": rid, "prompt": PROMPT}, **keys)
                                                  for rid, keys, _, _, _ in BAD_REQUESTS]
    out = os.path.join(work, "out")
    manifest = job_manifest(work, "bad.toml", d, jsonl(os.path.join(work, "bad.jsonl"), rows), out,
                            ["mp4"], tp=2, dp=1, steps=2)
    rc, log = H.run(["run", manifest, "--progress", "none"], np_=2, timeout=300)
    recs = {r["id"]: r for r in results(out)} if os.path.exists(os.path.join(out, "results.jsonl")) else {}
    H.check(rc == 6, f"a job with refused requests exits 6 (exit {rc})" + ("" if rc == 6 else f"\n{log[-1500:]}"))
    H.check(recs.get("good", {}).get("status") == "done" and os.path.exists(os.path.join(out, "videos", "good.mp4")),
            "the good request is done (videos/good.mp4)")
    for rid, _, want, _, _ in BAD_REQUESTS:
        r = recs.get(rid, {})
        err = r.get("error", "")
        H.check(r.get("status") == "failed" and all(w in err for w in want),
                f"job request {rid}: failed naming {want}: {err[:300]!r}")
    H.check(not glob.glob(os.path.join(out, "videos", "*.tmp*")) and not os.path.exists(os.path.join(
        out, "videos", "odd.mp4")), "no MP4 (or temporary) for the refused requests")
    # frames past the shared bound: the requests file itself is refused, naming its line and key.
    rows = [{"id": "good", "prompt": PROMPT}, {"id": "frames4097", "prompt": PROMPT, "frames": 4097}]
    reqs = jsonl(os.path.join(work, "bound.jsonl"), rows)
    manifest = job_manifest(work, "bound.toml", d, reqs, os.path.join(work, "out-bound"), ["mp4"], tp=2, dp=1)
    H.expect_config_error("job request frames 4097", ["run", manifest], f"{reqs}:2: frames: 4097 is outside")


def job_manifest(work, name, model, requests, out, formats, tp, dp, steps=4, extra=""):
    text = (f'model = "{model}"\ndtype = "fp32"\nrequests = "{requests}"\n[parallel]\ntp = {tp}\ndp = {dp}\n'
            f'[defaults]\nheight = 64\nwidth = 64\nframes = 5\nsteps = {steps}\nguidance = 4.0\nseed = 3\n'
            f'[output]\ndir = "{out}"\nformats = {json.dumps(formats)}\n' + extra)
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


# ---- memory --------------------------------------------------------------------------------------------

def case_memory(work):
    d = folder(work, "wan")
    rows = [{"id": "small", "prompt": PROMPT},
            {"id": "huge", "prompt": PROMPT, "frames": 4093, "height": 480, "width": 832}]
    for tp in (1, 2):
        out = os.path.join(work, f"out{tp}")
        m = job_manifest(work, f"mem{tp}.toml", d, jsonl(os.path.join(work, "mem.jsonl"), rows), out, ["frames"],
                         tp=tp, dp=1, steps=2)
        cmd = (f"ulimit -v {4 * 1024 * 1024} && exec {H.mpirun} --oversubscribe -np {tp} {H.tprun} run {m} "
               f"--progress log --log-dir ''")
        t0 = time.monotonic()
        try:
            p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=240)
            rc, log = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            rc, log = None, "timed out: the huge request ran (its frames not counted?)"
        dt = time.monotonic() - t0
        recs = {r["id"]: r for r in results(out)} if os.path.exists(os.path.join(out, "results.jsonl")) else {}
        huge = recs.get("huge", {})
        err = huge.get("error", "")
        H.check(rc == 6, f"tp {tp}: exit {rc} (want 6: a request failed) in {dt:.1f} s"
                + ("" if rc == 6 else f"\n{log[-1500:]}"))
        H.check(huge.get("status") == "failed" and "4093 frames" in err and "needs about" in err
                and "fewer frames" in err and "is available" in err,
                f"tp {tp}: the 4093-frame request failed on its estimate: {err[:400]!r}")
        aborted = [w for w in ("SIGABRT", "Aborted", "signal 6", "terminate called", "MPI_ABORT") if w in log]
        H.check("ran out of memory" not in err and not aborted and huge.get("timings", {}).get("denoise_s", 0) == 0,
                f"tp {tp}: refused before any compute (no allocation failure, no abort {aborted}, no denoising time: "
                f"{huge.get('timings')})")
        H.check(recs.get("small", {}).get("status") == "done"
                and os.path.exists(os.path.join(out, "videos", "small", "frame_00004.png")),
                f"tp {tp}: the small request is done (5 frame PNGs)")
        H.check(not os.path.exists(os.path.join(out, "videos", "huge")), f"tp {tp}: nothing written for huge")


# ---- experts -------------------------------------------------------------------------------------------

def demo_run(d, out, experts, tp, dp, extra_sets=(), requests=None):
    args = ["run", DEMO, "--set", f'model="{d}"', "--set", f'output.dir="{out}"', "--set", 'output.formats=["frames"]',
            "--set", f'schedule.experts="{experts}"', "--set", "schedule.stage_requests=2",
            "--set", f"parallel.tp={tp}", "--set", f"parallel.dp={dp}", "--progress", "log", *extra_sets]
    if requests:
        args += ["--set", f'requests="{requests}"']
    return args


def frame_bytes(out):
    """{videos/<id>/frame_*.png relative path: bytes} of a job's output."""
    base = os.path.join(out, "videos")
    return {os.path.relpath(p, base): read(p) for p in sorted(glob.glob(os.path.join(base, "*", "frame_*.png")))}


def png(data):
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int32)


def demo_ids():
    return [json.loads(line)["id"] for line in open(os.path.join(ROOT, "jobs", "wan-prompts.jsonl")) if line.strip()]


def case_experts(work):
    d = folder(work, "wan-a14b")
    ids = demo_ids()
    frames = {}
    for experts in ("resident", "staged"):
        for tp, dp in ((2, 1), (1, 2)):
            name = f"{experts}-dp{dp}tp{tp}"
            out = os.path.join(work, name)
            t0 = time.monotonic()
            rc, log = H.run(demo_run(d, out, experts, tp, dp), np_=2, timeout=600)
            dt = time.monotonic() - t0
            if not H.check(rc == 0, f"{name}: exit {rc} in {dt:.1f} s" + ("" if rc == 0 else f"\n{log[-2000:]}")):
                continue
            recs = results(out)
            H.check(sorted(r["id"] for r in recs) == sorted(ids) and all(r["status"] == "done" for r in recs),
                    f"{name}: all {len(ids)} requests done")
            swaps = log.count("now holds transformer_2")
            if experts == "staged":
                # stage_requests 2: 3 rounds at dp 1 (2 a replica at dp 2), each swapping to transformer_2 once.
                H.check(swaps >= 2 and "both resident" not in log,
                        f"{name}: experts held one at a time ({swaps} swaps to transformer_2 logged)")
            else:
                H.check(swaps == 0, f"{name}: both experts resident (no swap)")
            frames[name] = frame_bytes(out)
            if name == "staged-dp1tp2":
                rc2, log2 = H.run(demo_run(d, out, experts, tp, dp), np_=2, timeout=300)
                H.check(rc2 == 0 and "0 to run" in log2, f"{name}: a rerun resumes with nothing to run (exit {rc2})")
    base = frames.get("resident-dp1tp2", {})
    H.check(len(base) == 5 * 3 + 9 * 3, f"resident dp1 x tp2: {len(base)} frame PNGs (3 videos of 5, 3 of 9)")
    for layout in ("dp1tp2", "dp2tp1"):
        a, b = frames.get(f"resident-{layout}", {}), frames.get(f"staged-{layout}", {})
        same = [k for k in a if b.get(k) == a[k]]
        H.check(len(a) == len(base) and len(b) == len(a) and len(same) == len(a),
                f"{layout}: {len(same)} of {len(a)} frame PNGs byte-identical between resident and staged")
    # tp 2 sums partial products in another order than tp 1 (fp32): a pixel may move one level.
    other = frames.get("resident-dp2tp1", {})
    diff = max((int(np.abs(png(other[k]) - png(v)).max()) for k, v in base.items() if k in other), default=None)
    H.check(set(other) == set(base) and diff is not None and diff <= 1,
            f"dp2 x tp1 against dp1 x tp2: frames within {diff} level(s) of 255 (at most 1)")
    interrupted(work, d, base)
    auto(work, d, base)


def interrupted(work, d, base):
    """A staged dp 1 x tp 2 run stopped by SIGTERM once its first round is recorded; the resume completes."""
    out = os.path.join(work, "sigterm")
    cmd = [H.mpirun, "--oversubscribe", "-np", "2", H.tprun, *demo_run(d, out, "staged", 2, 1), "--log-dir", ""]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = os.path.join(out, "results.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(log) and len(results(out)) >= 1:
            break
        time.sleep(0.05)
    pids = subprocess.run(["pgrep", "-P", str(p.pid)], stdout=subprocess.PIPE, text=True).stdout.split()
    for pid in pids:  # as Slurm does: every task gets SIGTERM
        os.kill(int(pid), signal.SIGTERM)
    try:
        text, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
    n = len(results(out)) if os.path.exists(log) else 0
    H.check(p.returncode == 75 and 0 < n < len(demo_ids()),
            f"SIGTERM after the first round: exit {p.returncode} (want 75), {n} of {len(demo_ids())} recorded"
            + ("" if p.returncode == 75 else f"\n{text[-1500:]}"))
    rc, log_text = H.run(demo_run(d, out, "staged", 2, 1), np_=2, timeout=300)
    recs = results(out)
    done = sorted(r["id"] for r in recs if r["status"] == "done")
    H.check(rc == 0 and done == sorted(demo_ids()) and len(recs) == len(demo_ids()),
            f"the resume completes: exit {rc}, {len(done)} done, {len(recs)} records"
            + ("" if rc == 0 else f"\n{log_text[-1500:]}"))
    got = frame_bytes(out)
    same = [k for k in base if got.get(k) == base[k]]
    H.check(len(same) == len(base) and len(got) == len(base),
            f"interrupted + resumed: {len(same)} of {len(base)} frame PNGs byte-identical to resident")
    H.check(not glob.glob(os.path.join(out, "videos", "**", "*.tmp*"), recursive=True), "no temporary file left")


def auto(work, d, base):
    """schedule.experts = "auto" on a folder whose experts fit: resident, said in its log line."""
    reqs = jsonl(os.path.join(work, "two.jsonl"),
                 [json.loads(line) for line in open(os.path.join(ROOT, "jobs", "wan-prompts.jsonl"))][:2])
    out = os.path.join(work, "auto")
    rc, log = H.run(demo_run(d, out, "auto", 2, 1, requests=reqs), np_=2, timeout=300)
    line = next((ln for ln in log.splitlines() if "schedule.experts" in ln), "")
    H.check(rc == 0 and 'schedule.experts = "auto" (resident)' in line,
            f"auto: exit {rc}, {line.split('] ')[-1] or 'no schedule.experts line'}" + ("" if rc == 0 else log[-1500:]))
    got = frame_bytes(out)
    H.check(bool(got) and all(base.get(k) == v for k, v in got.items()),
            f"auto: its {len(got)} frame PNGs equal resident's")


# ---- plan ----------------------------------------------------------------------------------------------

def tensor_bytes(component):
    """Bytes of the tensors of a component's safetensors files (their headers' data offsets)."""
    total = 0
    for path in glob.glob(os.path.join(component, "*.safetensors")):
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def case_plan(work):
    plan_checks(folder(work, "wan-a14b"), ["--world", "2"], (1, 2))
    # Wan 2.2 A14B at its real size: sparse files (tensor names, shapes and shards, no bytes), 8 x 80 GiB.
    sparse = os.path.join(work, "a14b-sparse")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_sparse_pipeline.py"), sparse, "--arch",
                        "wan2.2-a14b", "--tprun", H.tprun], capture_output=True, text=True, timeout=240)
    if H.check(r.returncode == 0, f"make_sparse_pipeline.py --arch wan2.2-a14b: exit {r.returncode}"
               + ("" if r.returncode == 0 else r.stderr[-800:])):
        plan_checks(sparse, ["--world", "8", "--device-memory", "80GiB", "--dtype", "bf16"], (1, 2, 4, 8))


def plan_checks(d, flags, tps):
    """`plan --frames 81 [--stage-experts] --json` on the two-expert folder d: each candidate's denoise and decode
    phases one expert's bytes on the rank smaller with the flag."""
    plans = {}
    for staged in (False, True):
        args = [H.tprun, "plan", "--model", d, "--frames", "81", *flags, "--json"]
        r = subprocess.run(args + (["--stage-experts"] if staged else []), capture_output=True, text=True,
                           timeout=120)
        if not H.check(r.returncode == 0, f"plan{' --stage-experts' if staged else ''}: exit {r.returncode}"
                       + ("" if r.returncode == 0 else r.stderr[-800:])):
            return
        plans[staged] = json.loads(r.stdout)
        req = plans[staged]["request"]
        H.check(req.get("frames") == 81 and req.get("experts") == ("staged" if staged else "resident"),
                f"the plan says what it planned: {req}; chosen {plans[staged].get('chosen')}")
    expert = tensor_bytes(os.path.join(d, "transformer_2"))
    H.check(expert == tensor_bytes(os.path.join(d, "transformer")), f"the two experts hold the same bytes ({expert})")
    for tp in tps:
        for stages in ("together", "staged"):
            a, b = candidate(plans[False], tp, stages), candidate(plans[True], tp, stages)
            if not H.check(a is not None and b is not None, f"tp {tp} {stages}: both plans have the candidate"):
                continue
            one = a["components"]["transformer_2"]  # this rank's bytes of the expert
            # A rank holds 1 / tp of the expert's split tensors and all of its replicated ones; the modules
            # diffusers keeps in fp32 are held in fp32 under bf16 (a few tenths of a percent more than the file).
            rest = {k: v for k, v in a["components"].items() if k != "transformer_2"}
            H.check(expert / tp <= one <= expert * 1.01 and b["components"] in (a["components"], rest),
                    f"tp {tp} {stages}: transformer_2 is {one} bytes on rank 0 ({expert} in its files); staged: "
                    f"{sorted(b['components'])}")
            for phase in ("denoise", "decode"):
                less = a["phases"][phase] - b["phases"][phase]
                H.check(less == one, f"tp {tp} {stages}: the {phase} phase {a['phases'][phase]} -> "
                        f"{b['phases'][phase]} bytes with --stage-experts, {less} less (one expert: {one}); fits "
                        f"{a['fits']} -> {b['fits']}")


def candidate(plan, tp, stages):
    return next((c for c in plan.get("candidates", []) if c["tp"] == tp and c["stages"] == stages), None)


# ---- components ----------------------------------------------------------------------------------------

def forward(work, d, component, inputs, tag, np_=1):
    from safetensors.torch import load_file, save_file
    inp, out = os.path.join(work, f"{tag}_in.safetensors"), os.path.join(work, f"{tag}_out.safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, inp)
    rc, log = H.run(["forward", "--model", d, "--component", component, "--inputs", inp, "--out", out,
                     "--tp", str(np_)], np_=np_, timeout=300)
    if not H.check(rc == 0, f"forward --component {component} tp {np_} ran" + ("" if rc == 0 else f": {log[-1500:]}")):
        return None
    return load_file(out)


def within(label, got, want, tol=1e-4):
    d = float((got.float() - want.float()).abs().max()) if got.shape == want.shape else float("inf")
    H.check(d <= tol, f"{label}: max abs diff {d:.3g} (tolerance {tol}), shape {tuple(got.shape)}")


def case_components(work):
    import diffusers
    import torch
    import transformers
    d = folder(work, "wan")
    g = torch.Generator().manual_seed(7)
    t = diffusers.WanTransformer3DModel.from_pretrained(os.path.join(d, "transformer")).eval()
    te = transformers.UMT5EncoderModel.from_pretrained(os.path.join(d, "text_encoder")).eval()
    vae = diffusers.AutoencoderKLWan.from_pretrained(os.path.join(d, "vae")).eval()
    c = t.config
    hidden = torch.randn(1, c.in_channels, 2, 4, 6, generator=g)
    text = torch.randn(1, 8, c.text_dim, generator=g)
    ids = torch.randint(1, te.config.vocab_size, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.int64)
    mask[1, 6:] = 0
    z = torch.randn(1, vae.config.z_dim, 2, 4, 6, generator=g)
    with torch.no_grad():
        want_t = t(hidden_states=hidden, timestep=torch.tensor([600.0]), encoder_hidden_states=text).sample
        want_te = te(input_ids=ids, attention_mask=mask).last_hidden_state
        want_v = vae.decode(z).sample
    for np_ in (1, 2):
        got = forward(work, d, "transformer", {"hidden_states": hidden, "timestep": torch.tensor([600.0]),
                                               "encoder_hidden_states": text}, f"t{np_}", np_)
        if got:
            within(f"transformer tp {np_} vs WanTransformer3DModel", got["sample"], want_t)
        got = forward(work, d, "text_encoder", {"input_ids": ids, "attention_mask": mask}, f"te{np_}", np_)
        if got:  # the padded positions' outputs are compared too: UMT5 computes them
            within(f"text_encoder tp {np_} vs UMT5EncoderModel", got["last_hidden_state"], want_te)
        got = forward(work, d, "vae_decoder", {"z": z}, f"v{np_}", np_)  # diffusers: decode(z)
        if got:
            within(f"vae_decoder tp {np_} vs AutoencoderKLWan.decode", got["sample"], want_v)
    rc, log = H.run(["verify", "--model", d, "--tp", "2"], np_=2, timeout=300)
    H.check(rc == 0 and "OK: max abs diff" in log, f"verify --model <wan folder> --tp 2: exit {rc}"
            + ("" if rc == 0 else f"\n{log[-1500:]}"))
    print("\n".join(log.splitlines()[-8:]), flush=True)


CASES = {"folders": case_folders, "requests": case_requests, "memory": case_memory, "experts": case_experts,
         "plan": case_plan, "components": case_components}


def main():
    global H
    if len(sys.argv) != 4 or sys.argv[3] not in CASES:
        raise SystemExit(f"usage: wan_cases.py TPRUN MPIRUN CASE ({', '.join(CASES)})")
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {sys.argv[3]: CASES[sys.argv[3]]}, "tprun-wan")


if __name__ == "__main__":
    sys.exit(main())
