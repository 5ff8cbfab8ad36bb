#!/usr/bin/env python3
"""`tprun run` with LoRA adapters (issue 34), the jobs side: what the records say and what resume does
with them, and the inputs refused before any load.

usage: lora_job_cases.py TPRUN MPIRUN CASE
CASE:
  records  a tiny FLUX.1 job at dp 2 with [[loras]] and per-request "loras" (PEFT files on one attention
           projection): each results.jsonl line names its adapters (as written, resolved, scale, the
           same XXH3-128 for the same bytes); the summary counts the sets and switches; a rerun skips
           all; a changed scale or changed file bytes reruns exactly that request with a warning naming
           it; adapters moved (same bytes) keep the record with a warning; a request without adapters
           has no "loras" in its line.
  staged   the same job with [schedule] phases = "staged" (the adapters prepared on each pipeline the
           replicas load) gives the same PNG bytes as "together", at dp 2.
  switch   one job at tp 2 whose requests name different sets ([[loras]] A, their own B, A + B with
           weights, none) run in groups, switching sets between batches at run time: each request's
           pixels equal `tprun generate` of that request alone with its adapters (tp 2), and the requests
           without adapters, run after a set was in force, give the PNG pixels of a job that never loaded
           an adapter, byte for byte; a job of one set (fused by `auto`) gives each request's image
           within 2/255 of the run-time one.
  memory   the fit planner counts each rank's adapter slices with the transformer (`tprun plan --lora`:
           A whole and B's rows at tp 2 for a colwise layer, to the byte); adapters on weights offloaded to
           disk (tp 2) give the resident run's pixels; with fp8 storage they run at run time and move
           the image as they move the full-precision one.
  inputs   bad adapter inputs under mpirun -np 2: exit 3 on both ranks naming the file and field, no
           model loaded, nothing written (a path outside the manifest's folder or a symlink leading out,
           a folder, a FIFO, a missing file, a non-finite scale, an unknown key, a bad [lora] apply).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import jsonl, results, tiny_flux, write, write_manifest  # noqa: E402

TPRUN, MPIRUN, CASE = sys.argv[1:4]


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def mpirun(np_, *args, check=True, timeout=300):
    cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", TPRUN, *args, "--log-dir", ""]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and p.returncode != 0:
        print(p.stdout)
        fail(f"exit code {p.returncode}")
    return p


def adapter(model, path, seed, rank=2, size=0.05):
    """A PEFT (diffusers) LoRA file for the tiny model: lora_A / lora_B on the first double block's to_q,
    values `size` x standard normal."""
    from safetensors.numpy import save_file
    cfg = json.load(open(os.path.join(model, "transformer", "config.json")))
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    rng = np.random.default_rng(seed)
    key = "transformer.transformer_blocks.0.attn.to_q"
    save_file({f"{key}.lora_A.weight": (size * rng.standard_normal((rank, inner))).astype(np.float32),
               f"{key}.lora_B.weight": (size * rng.standard_normal((inner, rank))).astype(np.float32)}, path)
    return path


def job(tmp, rows, tail):
    requests = jsonl(os.path.join(tmp, "r.jsonl"), rows)
    return write_manifest(os.path.join(tmp, "job.toml"), os.path.join(tmp, "model"), requests,
                          os.path.join(tmp, "out"), parallel={"tp": 1, "dp": 2}, tail=tail)


def by_id(out):
    return {r["id"]: r for r in results(out)}


def records(tmp):
    model = tiny_flux(TPRUN, os.path.join(tmp, "model"))
    os.makedirs(os.path.join(tmp, "adapters"))
    a = adapter(model, os.path.join(tmp, "adapters", "a.safetensors"), 1)
    b = adapter(model, os.path.join(tmp, "adapters", "b.safetensors"), 2)
    rows = [{"id": "job-set", "prompt": "a red fox"},
            {"id": "own", "prompt": "a red fox", "loras": [{"path": "adapters/b.safetensors", "scale": 0.7}]},
            {"id": "none", "prompt": "a red fox", "loras": []},
            {"id": "job-set-2", "prompt": "a lighthouse"},
            {"id": "own-2", "prompt": "a lighthouse", "loras": [{"path": "./adapters/b.safetensors", "scale": 0.7}]}]
    tail = '[[loras]]\npath = "adapters/a.safetensors"\nscale = 0.5\n'
    m = job(tmp, rows, tail)
    out = os.path.join(tmp, "out")
    p = mpirun(2, "run", m, "--progress", "none")
    recs = by_id(out)
    if sorted(recs) != sorted(r["id"] for r in rows) or any(r["status"] != "done" for r in recs.values()):
        print(p.stdout)
        fail(f"records: {recs}")
    ja, ow, no = recs["job-set"].get("loras"), recs["own"].get("loras"), recs["none"].get("loras")
    if no is not None:
        fail(f"a request without adapters has 'loras' in its line: {recs['none']}")
    if not ja or len(ja) != 1 or ja[0]["path"] != "adapters/a.safetensors" or ja[0]["scale"] != 0.5 \
            or ja[0]["resolved"] != os.path.realpath(a):
        fail(f"the job set's record: {ja}")
    if not ow or len(ow) != 1 or ow[0]["path"] != "adapters/b.safetensors" or ow[0]["scale"] != 0.7 \
            or ow[0]["resolved"] != os.path.realpath(b):
        fail(f"a request's own adapters' record: {ow}")
    if recs["own-2"]["loras"][0]["path"] != "./adapters/b.safetensors" or recs["own-2"]["loras"][0]["xxh3"] != ow[0]["xxh3"]:
        fail(f"the same file named another way: {recs['own-2']['loras']}")
    if len(ja[0]["xxh3"]) != 32 or ja[0]["xxh3"] == ow[0]["xxh3"]:
        fail(f"hashes: {ja[0]['xxh3']} {ow[0]['xxh3']}")
    summary = [l for l in p.stdout.splitlines() if "LoRA adapter sets 3 distinct" in l]
    hashed = [l for l in p.stdout.splitlines() if "LoRA adapters: 2 file(s)" in l]
    print(f"summary: {summary}; hashed: {hashed}", flush=True)
    if len(summary) != 1 or len(hashed) != 1:
        print(p.stdout)
        fail("the summary line does not count the sets, or the files were not hashed once")
    # Each replica switches at most once per set it runs (3 sets, 2 replicas: at most 3 + 3).
    switches = int(summary[0].split("distinct, ")[1].split(" ")[0])
    if not 3 <= switches <= 6:
        fail(f"{switches} switches for 3 sets over 2 replicas")

    # A rerun: nothing runs.
    p = mpirun(2, "run", m, "--progress", "none")
    if "5 already finished, 0 to run" not in p.stdout:
        print(p.stdout)
        fail("the rerun did not skip every request")

    # Another scale for one request: that one runs again, with a warning naming it.
    rows[1]["loras"][0]["scale"] = 0.9
    m = job(tmp, rows, tail)
    p = mpirun(2, "run", m, "--progress", "none")
    warned = [l for l in p.stdout.splitlines() if "request own: recorded done, but recorded with adapters" in l]
    if "4 already finished, 1 to run" not in p.stdout or len(warned) != 1 or "x0.9" not in warned[0]:
        print(p.stdout)
        fail("a changed scale did not rerun its request with a warning")
    if by_id(out)["own"]["loras"][0]["scale"] != 0.9:
        fail("the rerun's record does not name the new scale")

    # The job set's file rewritten (other bytes): both requests of the job set run again.
    adapter(model, a, 3)
    p = mpirun(2, "run", m, "--progress", "none")
    if "3 already finished, 2 to run" not in p.stdout or p.stdout.count("it runs again") != 2:
        print(p.stdout)
        fail("changed adapter bytes did not rerun the requests that use the file")
    if by_id(out)["job-set"]["loras"][0]["xxh3"] == ja[0]["xxh3"]:
        fail("the record keeps the old hash")

    # The adapters moved (same bytes): kept as done, said.
    shutil.move(os.path.join(tmp, "adapters"), os.path.join(tmp, "moved"))
    for r in rows:
        for entry in r.get("loras", []):
            entry["path"] = entry["path"].replace("adapters/", "moved/")
    m = job(tmp, rows, tail.replace("adapters/", "moved/"))
    p = mpirun(2, "run", m, "--progress", "none")
    if "5 already finished, 0 to run" not in p.stdout or p.stdout.count("kept as done") != 4:
        print(p.stdout)
        fail("adapters moved with the same bytes were not kept as done with a warning")


def staged(tmp):
    model = tiny_flux(TPRUN, os.path.join(tmp, "model"))
    os.makedirs(os.path.join(tmp, "adapters"))
    adapter(model, os.path.join(tmp, "adapters", "a.safetensors"), 1)
    adapter(model, os.path.join(tmp, "adapters", "b.safetensors"), 2)
    rows = [{"id": "job-set", "prompt": "a red fox"},
            {"id": "own", "prompt": "a red fox", "loras": [{"path": "adapters/b.safetensors", "scale": 0.7}]},
            {"id": "none", "prompt": "a red fox", "loras": []},
            {"id": "both", "prompt": "a lighthouse", "loras": [{"path": "adapters/b.safetensors", "scale": -0.5},
                                                             {"path": "adapters/a.safetensors"}]}]
    images = {}
    for phases in ("together", "staged"):
        out = os.path.join(tmp, "out-" + phases)
        requests = jsonl(os.path.join(tmp, "r.jsonl"), rows)
        m = write_manifest(os.path.join(tmp, "job.toml"), os.path.join(tmp, "model"), requests, out,
                           parallel={"tp": 1, "dp": 2},
                           tail='[schedule]\nphases = "%s"\n[[loras]]\npath = "adapters/a.safetensors"\nscale = 0.5\n'
                           % phases)
        mpirun(2, "run", m, "--progress", "none")
        recs = by_id(out)
        if sorted(recs) != sorted(r["id"] for r in rows) or any(r["status"] != "done" for r in recs.values()):
            fail(f"{phases}: {recs}")
        images[phases] = {r["id"]: open(os.path.join(out, "images", r["id"] + ".png"), "rb").read() for r in rows}
    from PIL import Image
    import io
    for r in rows:
        a = np.asarray(Image.open(io.BytesIO(images["together"][r["id"]])).convert("RGB"))
        b = np.asarray(Image.open(io.BytesIO(images["staged"][r["id"]])).convert("RGB"))
        print(f"{r['id']}: staged vs together max diff {int(np.abs(a.astype(int) - b.astype(int)).max())}", flush=True)
        if not np.array_equal(a, b):
            fail(f"{r['id']}: the staged image differs from the together one")
    base = np.asarray(Image.open(io.BytesIO(images["together"]["none"])).convert("RGB")).astype(int)
    for rid in ("job-set", "own", "both"):
        other = np.asarray(Image.open(io.BytesIO(images["together"][rid])).convert("RGB")).astype(int)
        print(f"{rid}: differs from the base image by up to {int(np.abs(other - base).max())}", flush=True)


def pixels(path):
    from PIL import Image
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def switch(tmp):
    model = tiny_flux(TPRUN, os.path.join(tmp, "model"))
    os.makedirs(os.path.join(tmp, "adapters"))
    # Large enough to move the tiny model's images visibly (tens of levels of 255).
    a = adapter(model, os.path.join(tmp, "adapters", "a.safetensors"), 1, rank=4, size=0.6)
    b = adapter(model, os.path.join(tmp, "adapters", "b.safetensors"), 2, rank=3, size=0.6)
    ab = [{"path": "adapters/b.safetensors", "scale": 0.6}, {"path": "adapters/a.safetensors", "scale": -0.8}]
    # Every request's seed given (a job derives an unset one from its id): `generate --seed 5` draws the same noise.
    rows = [{"id": "a1", "prompt": "a red fox", "seed": 5},
            {"id": "base1", "prompt": "a red fox", "seed": 5, "loras": []},
            {"id": "b1", "prompt": "a lighthouse", "seed": 5, "loras": [{"path": "adapters/b.safetensors", "scale": 1.5}]},
            {"id": "ab1", "prompt": "a lighthouse", "seed": 5, "loras": ab},
            {"id": "base2", "prompt": "a lighthouse", "seed": 5, "loras": []},
            {"id": "a2", "prompt": "a lighthouse", "seed": 5}]
    job_set = '[[loras]]\npath = "adapters/a.safetensors"\nscale = 1.2\n'

    def run_job(name, rows, tail):
        out = os.path.join(tmp, name)
        requests = jsonl(os.path.join(tmp, name + ".jsonl"), rows)
        m = write_manifest(os.path.join(tmp, name + ".toml"), model, requests, out,
                           parallel={"tp": 2, "dp": 1}, tail=tail)
        p = mpirun(2, "run", m, "--progress", "none")
        recs = by_id(out)
        if sorted(recs) != sorted(r["id"] for r in rows) or any(r["status"] != "done" for r in recs.values()):
            print(p.stdout)
            fail(f"{name}: {recs}")
        return out, p.stdout

    mixed, log = run_job("mixed", rows, job_set)
    summary = [l for l in log.splitlines() if "LoRA adapter sets 4 distinct" in l]
    print(f"summary: {summary}", flush=True)
    if len(summary) != 1 or "applied at run time" not in log:
        print(log)
        fail("the mixed job did not count 4 sets or did not apply them at run time")
    # The base requests ran after a set was in force (groups in order of first appearance: A, none, B, B+A).
    base_rows = [{"id": r["id"], "prompt": r["prompt"], "seed": 5} for r in rows if r["id"].startswith("base")]
    never, _ = run_job("never", base_rows, "")
    for r in base_rows:
        x, y = pixels(os.path.join(mixed, "images", r["id"] + ".png")), pixels(os.path.join(never, "images", r["id"] + ".png"))
        print(f"{r['id']}: after a switch back vs never adapted: max diff {int(np.abs(x - y).max())}", flush=True)
        if not np.array_equal(x, y):
            fail(f"{r['id']}: the base model after a switch back differs from a job that never loaded an adapter")
    # Each adapted request as `tprun generate` makes it alone.
    alone_sets = {"a1": [(a, 1.2)], "a2": [(a, 1.2)], "b1": [(b, 1.5)], "ab1": [(b, 0.6), (a, -0.8)]}
    for r in rows:
        if r["id"] not in alone_sets:
            continue
        png = os.path.join(tmp, "alone-" + r["id"] + ".png")
        flags = [f for path, scale in alone_sets[r["id"]] for f in ("--lora", path, "--lora-scale", str(scale))]
        mpirun(2, "generate", "--model", model, "--prompt", r["prompt"], "--height", "32", "--width", "32",
               "--steps", "2", "--max-sequence-length", "32", "--seed", "5", "--lora-apply", "runtime", *flags,
               "--out", png)
        x, y = pixels(os.path.join(mixed, "images", r["id"] + ".png")), pixels(png)
        base = pixels(os.path.join(never, "images", "base1.png")) if r["prompt"] == "a red fox" else \
            pixels(os.path.join(never, "images", "base2.png"))
        print(f"{r['id']}: job vs alone max diff {int(np.abs(x - y).max())}; moved from the base image by "
              f"{int(np.abs(x - base).max())}", flush=True)
        if not np.array_equal(x, y):
            fail(f"{r['id']}: the job's image differs from the same request alone")
        if int(np.abs(x - base).max()) < 8:
            fail(f"{r['id']}: the adapters hardly changed the image")
    # One set for the whole job: `auto` fuses it into the weights; within 2/255 of the run-time images.
    one_rows = [{"id": r["id"], "prompt": r["prompt"], "seed": 5} for r in rows if r["id"] in ("a1", "a2")]
    fused, log = run_job("fused", one_rows, job_set)
    if "fused into the weights" not in log:
        print(log)
        fail("a job of one adapter set was not fused")
    for r in one_rows:
        d = int(np.abs(pixels(os.path.join(fused, "images", r["id"] + ".png"))
                       - pixels(os.path.join(mixed, "images", r["id"] + ".png"))).max())
        print(f"{r['id']}: fused vs run time max diff {d}", flush=True)
        if d > 2:
            fail(f"{r['id']}: fused differs from run time by {d}/255")


def memory(tmp):
    model = tiny_flux(TPRUN, os.path.join(tmp, "model"))
    rank = 8
    ad = adapter(model, os.path.join(tmp, "ad.safetensors"), 1, rank=rank, size=0.6)
    inner = json.load(open(os.path.join(model, "transformer", "config.json")))
    inner = inner["num_attention_heads"] * inner["attention_head_dim"]

    def transformer_bytes(*extra):
        p = subprocess.run([TPRUN, "plan", "--model", model, "--world", "2", "--json", *extra],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
        return {c["tp"]: c["components"]["transformer"] for c in json.loads(p.stdout)["candidates"]
                if c["stages"] == "together"}

    base, adapted = transformer_bytes(), transformer_bytes("--lora", ad)
    # to_q is colwise: each rank keeps A whole [r, in] and its rows of B [out / tp, r], in fp32.
    want = {tp: rank * (inner + inner // tp) * 4 for tp in (1, 2)}
    got = {tp: adapted[tp] - base[tp] for tp in (1, 2)}
    print(f"planned adapter bytes per rank {got}, expected {want}", flush=True)
    if got != want:
        fail(f"the planner counts {got} adapter bytes per rank, not {want}")

    def generate(name, *extra):
        png = os.path.join(tmp, name + ".png")
        mpirun(2, "generate", "--model", model, "--prompt", "a red fox", "--height", "32", "--width", "32",
               "--steps", "2", "--seed", "5", *extra, "--out", png)
        return pixels(png)

    plain = generate("plain")
    resident = generate("resident", "--lora", ad)
    offloaded = generate("offloaded", "--lora", ad, "--memory",
                         'offload={type="block_level",to="disk",disk_path="%s"}' % os.path.join(tmp, "off"))
    print(f"offloaded vs resident: max diff {int(np.abs(offloaded - resident).max())}", flush=True)
    if not np.array_equal(offloaded, resident):
        fail("adapters on disk-offloaded weights differ from the resident run")
    fp8 = 'layerwise_casting={storage="float8_e4m3fn"}'
    fp8_plain, fp8_lora = generate("fp8", "--memory", fp8), generate("fp8-lora", "--lora", ad, "--memory", fp8)
    moved, moved_fp8 = int(np.abs(resident - plain).max()), int(np.abs(fp8_lora - fp8_plain).max())
    print(f"the adapter moves the image by {moved} (full precision) and {moved_fp8} (fp8 storage)", flush=True)
    if moved < 8 or moved_fp8 < moved // 2:
        fail("with fp8 storage the adapter does not move the image as it does in full precision")


def inputs(tmp):
    model = tiny_flux(TPRUN, os.path.join(tmp, "model"))
    os.makedirs(os.path.join(tmp, "job", "adapters"))
    os.makedirs(os.path.join(tmp, "outside"))
    adapter(model, os.path.join(tmp, "job", "adapters", "a.safetensors"), 1)
    far = adapter(model, os.path.join(tmp, "outside", "far.safetensors"), 2)
    os.symlink(far, os.path.join(tmp, "job", "adapters", "link.safetensors"))
    os.mkfifo(os.path.join(tmp, "job", "adapters", "fifo.safetensors"))
    os.makedirs(os.path.join(tmp, "job", "adapters", "dir.safetensors"))
    out = os.path.join(tmp, "out")

    def case(label, tail, loras, want):
        d = os.path.join(tmp, "job")
        row = {"id": "a", "prompt": "x"}
        if loras is not None:
            row["loras"] = loras
        requests = jsonl(os.path.join(d, "r.jsonl"), [row])
        m = write_manifest(os.path.join(d, "job.toml"), model, "r.jsonl", out, tail=tail)
        p = mpirun(2, "run", m, "--progress", "none", check=False, timeout=120)
        named = [l for l in p.stdout.splitlines() if want.format(job=m, requests=requests) in l]
        print(f"{label}: exit {p.returncode}, named on {len(named)} rank(s)", flush=True)
        if p.returncode != 3 or len(named) < 2 or "loaded " in p.stdout or os.path.exists(out):
            print(p.stdout)
            fail(f"{label}: not refused on every rank before the load, or something was written")

    case("outside the folder", "", [{"path": "../outside/far.safetensors"}],
         "{requests}:1: loras[0].path: ../outside/far.safetensors resolves to")
    case("a symlink leading out", "", [{"path": "adapters/link.safetensors"}],
         "{requests}:1: loras[0].path: adapters/link.safetensors resolves to")
    case("a folder", "", [{"path": "adapters/dir.safetensors"}], "loras[0].path: adapters/dir.safetensors is a folder")
    case("a FIFO", "", [{"path": "adapters/fifo.safetensors"}], "is not a regular file (a pipe)")
    case("a missing file", "", [{"path": "adapters/none.safetensors"}], "adapters/none.safetensors does not exist")
    case("a scale out of bounds", "", [{"path": "adapters/a.safetensors", "scale": 1e300}],
         "{requests}:1: loras[0].scale: 1e+300 is outside")
    case("an unknown key", "", [{"path": "adapters/a.safetensors", "weight": 1}], "loras[0].weight: unknown field")
    case("[[loras]] a folder", '[[loras]]\npath = "adapters/dir.safetensors"\n', None,
         "{job}:12: loras[0].path: adapters/dir.safetensors is a folder")
    case("[[loras]] nan", '[[loras]]\npath = "adapters/a.safetensors"\nscale = nan\n', None,
         "{job}:13: loras[0].scale: nan is outside")
    case("[lora] apply", '[lora]\napply = "merged"\n', None, "{job}:12: lora.apply: 'merged' is not one of")
    # A truncated adapter that one replica's request names (dp 2): the pipeline's prepare refuses it, and
    # both ranks (the other replica too) end naming it, before any image.
    bad = os.path.join(tmp, "job", "adapters", "bad.safetensors")
    data = open(os.path.join(tmp, "job", "adapters", "a.safetensors"), "rb").read()
    write(bad, data[: len(data) // 2], "wb")
    d = os.path.join(tmp, "job")
    jsonl(os.path.join(d, "r.jsonl"), [{"id": "a", "prompt": "x", "loras": [{"path": "adapters/bad.safetensors"}]},
                                       {"id": "b", "prompt": "x", "loras": []}])
    m = write_manifest(os.path.join(d, "job.toml"), model, "r.jsonl", out, parallel={"tp": 1, "dp": 2})
    p = mpirun(2, "run", m, "--progress", "none", check=False, timeout=120)
    named = [l for l in p.stdout.splitlines() if "bad.safetensors" in l and "raised on rank" in l]
    print(f"a truncated adapter: exit {p.returncode}, named on {len(named)} rank(s)", flush=True)
    if p.returncode in (0, 6) or len(named) < 2 or os.path.exists(os.path.join(out, "images", "b.png")) \
            or open(bad, "rb").read() != data[: len(data) // 2]:
        print(p.stdout)
        fail("a truncated adapter was not refused on every rank before any image, or it was changed")
    shutil.rmtree(out)
    # [lora] dirs lets a request reach the folder outside; the symlink then resolves inside it.
    d = os.path.join(tmp, "job")
    jsonl(os.path.join(d, "r.jsonl"), [{"id": "a", "prompt": "x", "loras": [{"path": "adapters/link.safetensors"}]}])
    m = write_manifest(os.path.join(d, "job.toml"), model, "r.jsonl", out, tail='[lora]\ndirs = ["../outside"]\n')
    mpirun(2, "run", m, "--progress", "none")
    rec = results(out)[0]
    if rec["status"] != "done" or rec["loras"][0]["resolved"] != os.path.realpath(far):
        fail(f"[lora] dirs: {rec}")


def main():
    tmp = tempfile.mkdtemp(prefix=f"tprun-lora-jobs-{CASE}-")
    try:
        {"records": records, "staged": staged, "switch": switch, "memory": memory, "inputs": inputs}[CASE](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"lora_job_cases {CASE}: ok")


if __name__ == "__main__":
    main()
