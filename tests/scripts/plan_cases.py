#!/usr/bin/env python3
"""`tprun plan` (the fit planner) and what it shares with `tprun inspect`, on tiny init-model folders:
  json_fields   --json: every candidate's fields (tp a divisor of the world, dp = world / tp, phases and
                components as integers, peak = largest phase + overhead), tp the model refuses listed
                with the reason, the chosen plan; the same numbers as the text table; one output under
                mpirun -np 2
  no_fit        --device-memory below every peak: chosen null, exit 3, a message naming the memory
  bad_flags     --world 0, --device-memory garbage, --dtype xx, --height 100, a folder that is not a
                pipeline, MANIFEST and --model together: exit 3 naming the flag (or load_pipeline's words)
  manifest      a manifest's dtype, [memory], [output] batch_size and requests (the largest planned for)
                are read; flags override them
  inspect_cut   `tprun inspect --json --tp 1` of a pipeline folder: the FLUX.2 text encoder's layers
                after the stacked hidden states (and lm_head, the VAE's encoder) shown "(not loaded)"
                and left out of bytes_per_rank, which equal `tprun plan`'s fp32 weight bytes

usage: plan_cases.py TPRUN MPIRUN CASE
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

TPRUN, MPIRUN, CASE = sys.argv[1:4]
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures += 1
    return ok


def tprun(*args, np_=0, timeout=120):
    """(exit code, stdout, stderr) of tprun ARGS (under mpirun -np np_ when np_ > 0)."""
    cmd = [TPRUN, *args] if np_ == 0 else [MPIRUN, "--oversubscribe", "-np", str(np_), TPRUN, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def init_model(work, arch):
    d = os.path.join(work, arch)
    subprocess.run([TPRUN, "init-model", d, "--arch", arch, "--preset", "tiny"], check=True,
                   stdout=subprocess.DEVNULL)
    return d


def plan_json(*args):
    rc, out, err = tprun("plan", *args, "--json")
    if not check(rc == 0, f"plan {' '.join(args)} --json: exit {rc}" + ("" if rc == 0 else f"\n{err[-800:]}")):
        return None
    return json.loads(out)


def case_json_fields(work):
    d = init_model(work, "flux2-klein")
    p = plan_json("--model", d, "--world", "4", "--device-memory", "64GiB", "--height", "256", "--width", "256")
    if p is None:
        return
    check(p["rank_memory"] == 64 << 30 and p["device"] in ("cpu", "cuda"), "rank memory from --device-memory")
    check(p["request"]["height"] == 256 and p["request"]["batch"] == 1, "the request planned for")
    cands = p["candidates"]
    check({(c["tp"], c["stages"]) for c in cands} == {(1, "together"), (1, "staged"), (2, "together"),
                                                      (2, "staged")}, "tp 1 and 2, both ways (klein tiny: 2 heads)")
    check([r["tp"] for r in p["refused"]] == [4] and "num_attention_heads" in p["refused"][0]["reason"],
          f"tp 4 refused with the reason: {p['refused']}")
    for c in cands:
        name = f"tp {c['tp']} {c['stages']}"
        ints = [c["tp"], c["dp"], c["peak"], *c["phases"].values(), *c["components"].values()]
        check(all(isinstance(v, int) and not isinstance(v, bool) for v in ints), f"{name}: integers")
        check(set(c["phases"]) == {"encode", "denoise", "decode"}, f"{name}: phases")
        check(c["dp"] * c["tp"] == 4, f"{name}: dp = world / tp")
        check(c["peak"] == max(c["phases"].values()) + p["overhead"], f"{name}: peak = largest phase + overhead")
        check(isinstance(c["checked_peak"], int) and c["checked_peak"] > c["peak"],
              f"{name}: checked_peak (with the request check's margin) above the estimate")
        check(isinstance(c["fits"], bool) and c["fits"] == (c["checked_peak"] <= p["rank_memory"]), f"{name}: fits")
        want = {"transformer", "text_encoder"} | ({"vae"} if c["rank"] == 0 else set())
        check(set(c["components"]) == want, f"{name}: components {sorted(c['components'])}")
    by = {(c["tp"], c["stages"]): c for c in cands}
    check(by[(1, "staged")]["peak"] < by[(1, "together")]["peak"], "staged below together")
    check(by[(2, "together")]["components"]["transformer"] < by[(1, "together")]["components"]["transformer"],
          "the transformer split over tp 2")
    check(p["chosen"] == {"tp": 1, "dp": 4, "stages": "staged", "auto_stages": "together"},
          f"chosen: most replicas, less memory; phases auto runs it together (it fits): {p['chosen']}")
    # The text table: one row per candidate and the choice.
    rc, out, _ = tprun("plan", "--model", d, "--world", "4", "--device-memory", "64GiB", "--height", "256",
                       "--width", "256")
    rows = [l.split() for l in out.splitlines() if l.split()[:1] in (["1"], ["2"])]
    ok = rc == 0 and len(rows) == 4 and all(r[-1] in ("yes", "no") for r in rows)
    check(ok, "text: a row per candidate" + ("" if ok else f"\n{out}"))
    check('chosen: tp 1 x dp 4, staged (the least memory); schedule.phases = "auto" runs it together' in out and "tp 4: not possible" in out, "text choice and refusal")
    # Under mpirun: rank 0 alone prints.
    rc, out, err = tprun("plan", "--model", d, "--device-memory", "64GiB", "--json", np_=2)
    check(rc == 0 and out.count('"candidates"') == 1, f"mpirun -np 2: one output (exit {rc}) {err[-400:]}")
    if rc == 0:
        check(json.loads(out)["chosen"]["dp"] * json.loads(out)["chosen"]["tp"] == 2, "the launcher's world of 2")


def case_no_fit(work):
    d = init_model(work, "flux")
    rc, out, err = tprun("plan", "--model", d, "--world", "2", "--device-memory", "1MB", "--json")
    check(rc == 3, f"exit {rc} (want 3)")
    try:
        p = json.loads(out)
        check(p["chosen"] is None and p["candidates"] and not any(c["fits"] for c in p["candidates"]),
              "chosen null, nothing fits")
    except json.JSONDecodeError:
        check(False, f"JSON printed before the error: {out[:400]}")
    check("no plan fits in 976.6 KiB per rank" in err, f"the message names the memory: {err[-400:]}")


def case_bad_flags(work):
    d = init_model(work, "flux")
    for args, want in ((["--world", "0"], "--world 0"), (["--device-memory", "lots"], "--device-memory"),
                       (["--dtype", "xx"], "--dtype 'xx'"), (["--height", "100"], "height 100"),
                       (["--batch", "0"], "--batch 0")):
        rc, _, err = tprun("plan", "--model", d, *args)
        check(rc == 3 and want in err, f"{' '.join(args)}: exit {rc}, '{want}' in: {err.strip()[-300:]}")
    rc, _, err = tprun("plan", "--model", work)
    check(rc == 3 and "not a diffusers pipeline folder (no model_index.json)" in err,
          f"not a pipeline: exit {rc}: {err.strip()[-300:]}")
    manifest = os.path.join(work, "job.toml")
    with open(manifest, "w") as f:
        f.write(f'model = "{d}"\nrequests = "r.jsonl"\n')
    rc, _, err = tprun("plan", manifest, "--model", d)
    check(rc == 3 and "one of them" in err, f"manifest and --model: exit {rc}: {err.strip()[-300:]}")


def case_manifest(work):
    d = init_model(work, "flux2-klein")
    with open(os.path.join(work, "r.jsonl"), "w") as f:
        f.write('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y", "height": 128, "width": 256}\n')
    manifest = os.path.join(work, "job.toml")
    with open(manifest, "w") as f:
        f.write(f'model = "{d}"\nrequests = "r.jsonl"\ndtype = "bf16"\n[defaults]\nheight = 64\nwidth = 64\n'
                '[memory]\nlayerwise_casting = { storage = "float8_e4m3fn" }\n[output]\nbatch_size = 2\n')
    p = plan_json(manifest, "--world", "2", "--device-memory", "64GiB")
    if p is None:
        return
    r = p["request"]
    check((r["height"], r["width"], r["batch"], r["stage_requests"]) == (128, 256, 2, 2),
          f"the largest request, the batch size, the requests kept: {r}")
    plain = plan_json("--model", d, "--world", "2", "--device-memory", "64GiB", "--dtype", "bf16")
    if plain:
        a = {(c["tp"], c["stages"]): c for c in p["candidates"]}
        b = {(c["tp"], c["stages"]): c for c in plain["candidates"]}
        check(a[(1, "together")]["components"]["transformer"] < b[(1, "together")]["components"]["transformer"],
              "the manifest's fp8 storage counted")
    p = plan_json(manifest, "--world", "2", "--device-memory", "64GiB", "--height", "64", "--width", "64",
                  "--batch", "1", "--dtype", "fp32")
    if p:
        check((p["request"]["height"], p["request"]["batch"]) == (64, 1), f"flags override: {p['request']}")


def case_inspect_cut(work):
    for arch in ("flux2-klein", "flux2-dev", "flux"):
        d = init_model(work, arch)
        rc, out, err = tprun("inspect", d, "--json", "--tp", "1")
        if not check(rc == 0, f"{arch}: inspect exit {rc} {err[-300:]}"):
            continue
        comps = {c["name"]: c for c in json.loads(out)["components"] if c.get("weights")}
        p = plan_json("--model", d, "--device-memory", "64GiB", "--dtype", "fp32")
        if p is None:
            continue
        planned = p["candidates"][0]["components"]
        for name, bytes_ in planned.items():
            check(comps[name]["tp"]["bytes_per_rank"] == [bytes_],
                  f"{arch} {name}: inspect reads {comps[name]['tp']['bytes_per_rank']}, plan holds {bytes_}")
        not_loaded = {t["name"] for c in comps.values() for t in c["tensors"] if t["plan"] == "(not loaded)"}
        if arch == "flux":
            check(all(n.startswith(("encoder.", "quant_conv.")) for n in not_loaded) and not_loaded,
                  "FLUX.1: only the VAE's encoder is not loaded (no cut of CLIP or T5)")
        else:
            cut = "model.layers.27." if arch == "flux2-klein" else "language_model.model.layers.30."
            check(any(n.startswith(cut) for n in not_loaded), f"{arch}: {cut}* not loaded")
            check(not any(n.startswith(cut.replace("27", "26").replace("30", "29")) for n in not_loaded),
                  f"{arch}: the last stacked layer is loaded")
    # A component folder on its own: as before (every tensor in its plan, all counted).
    d = os.path.join(work, "flux2-klein", "text_encoder")
    rc, out, _ = tprun("inspect", d, "--json", "--tp", "1")
    comp = json.loads(out)["components"][0] if rc == 0 else {"tensors": [], "tp": {}}
    check(rc == 0 and not any(t["plan"] == "(not loaded)" for t in comp["tensors"])
          and comp["tp"].get("bytes_per_rank") == [comp["total_bytes"]], "a component alone: unchanged")


CASES = {"json_fields": case_json_fields, "no_fit": case_no_fit, "bad_flags": case_bad_flags,
         "manifest": case_manifest, "inspect_cut": case_inspect_cut}

if __name__ == "__main__":
    work = tempfile.mkdtemp(prefix=f"tprun-plan-{CASE}-")
    try:
        CASES[CASE](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'FAILED' if failures else 'OK'}: {failures} failure(s)")
    sys.exit(1 if failures else 0)
