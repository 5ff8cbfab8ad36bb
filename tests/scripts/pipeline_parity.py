#!/usr/bin/env python3
"""`tprun` against diffusers' own pipelines, one harness for every registered pipeline class.

usage: pipeline_parity.py TPRUN MPIRUN CASE [CLASS[:VARIANT] ...]
Without a CLASS the case runs for every class the binary registers (registered_pipelines.py), saying for each
family where it does not apply and why. What differs between families is their entry in pipeline_families.py.
Every folder is written by `tprun init-model` (random weights, tokenizers learned from the bundled text, no
download); diffusers runs on the CPU in fp32 with a CPU generator.

Cases (one ctest entry each, tests/CMakeLists.txt):
  registered  every class the binary registers has an init-model preset (its folder names that class) and a
              pipeline_families.py entry, and every entry is a registered class.
  folders     diffusers' pipeline class loads the folder; every model component model_index.json names loads in
              its library with no missing, unexpected or mismatched key (but the entry's allowed_missing);
              each tokenizer is the class model_index.json names and fits its text encoder's embedding rows;
              `tprun tokenize --json` gives the ids of the pipeline's own tokenizer calls on the entry's prompts;
              a 64 x 64 image generates in diffusers (in [0, 1]) and its time is printed.
  generate    each variant folder (an edit of the init-model folder: FLUX.1-schnell, klein distilled) and each of
              its calls through diffusers and through `tprun generate` at each tp (and each flag set): the final
              packed latents (diffusers' at the last step, through callback_on_step_end), the float image
              (output_type "np") and, where the entry says, the PNG against diffusers' uint8 image, within the
              entry's tolerances. CLASS:VARIANT runs one variant.
  components  `tprun forward --component vae_decoder | vae_encoder` against the diffusers VAE class the folder
              names (decode, encode's latent_dist mean and std), within 1e-4; and the entry's own components
              case (FLUX.1: the committed CLIP / T5 / VAE cases, T5 at tp 2, `verify --tp 2`).
  reference   the entry's committed reference case (FLUX.1: tests/data/flux_pipeline through `generate --inputs`).
  errors      the entry's refusals: exit code on every rank naming the problem, before any weight byte.
  job         the entry's jobs/*.toml demo at dp 2 x tp 2 in each of its phases: every request done, the same
              PNG bytes in every phase, the prompt cache's saved encodes, a request equal to `generate` of it
              alone, a rerun runs nothing, `tprun plan` sizes the folder.
  batch       prompts of different token lengths batched in one job give the images `generate` gives alone, and
              diffusers' batched call the latents tprun gives alone.
  long_prompt a prompt of about 800 tokens at a max_sequence_length past FLUX.1's 512: tokenize, generate against
              diffusers at tp 1, and a `run` request with [defaults] max_sequence_length 1024.
"""
import json
import os
import subprocess
import sys
import tomllib

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline_families import FAMILIES, PROMPT, copy_folder, png_pixels  # noqa: E402
from registered_pipelines import folder_class, init_model, preset_folders, registered_pipelines  # noqa: E402
from tprun_harness import Harness, run_cases  # noqa: E402

WEIGHTS_READ = "bytes on this rank"  # a pipeline's load line: a weight was read
COMPONENT_TOL = 1e-4


class ParityHarness(Harness):
    def within(self, label, got, want, tol):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        ok = got.shape == want.shape
        d = float(np.abs(got - want).max()) if ok else float("inf")
        return self.check(ok and d <= tol, f"{label}: max abs diff {d:.3g} (tolerance {tol})"
                          + ("" if ok else f", shapes {got.shape} vs {want.shape}"))

    def refused(self, r, folder, work):
        """Refusal `r` on `folder` (a copy edited by r.edit when given)."""
        if r.edit is not None:
            folder = copy_folder(folder, os.path.join(work, "refusal-" + "".join(c if c.isalnum() else "-"
                                                                                 for c in r.label)), r.edit)
        rc, log = self.run(["generate", "--model", folder, "--prompt", PROMPT, "--height", "64", "--width", "64",
                            "--steps", str(r.steps), "--out", os.path.join(work, "never.png"), *r.extra],
                           np_=r.np_, timeout=120)
        lines = [line for line in log.splitlines() if r.want in line]
        ok = rc == r.code and len(lines) >= r.np_ and WEIGHTS_READ not in log
        return self.check(ok, f"{r.label}: exit {rc} (want {r.code}), '{r.want}' on {len(lines)} of {r.np_} ranks, "
                          "no weight read" + ("" if ok else f"\n{log[-1200:]}"))


H = None  # ParityHarness, set in main()
WORK = None
_ARCHS = {}  # class -> (arch, seed-0 folder)


def family(cls):
    if cls not in FAMILIES:
        raise SystemExit(f"FAIL: {cls} has no entry in pipeline_families.py")
    return FAMILIES[cls]


def folder_for(cls, seed=0, name=None):
    """An init-model folder of `cls` (seed 0: the one preset_folders wrote)."""
    if cls not in _ARCHS:
        _ARCHS.update(preset_folders(H.tprun, WORK, [cls]))
    arch, base = _ARCHS[cls]
    if seed == 0 and name is None:
        return base
    dst = os.path.join(WORK, name or f"{arch}-seed{seed}")
    if seed == 0:
        return copy_folder(base, dst)
    return init_model(H.tprun, dst, arch, "--seed", str(seed))


def load_pipe(folder):
    import diffusers
    import torch
    return getattr(diffusers, folder_class(folder)).from_pretrained(folder, dtype=torch.float32)


def diffusers_call(pipe, prompt, seed, steps, height, width, **kw):
    """(last-step latents, image [1, H, W, 3] float) of one diffusers call; `prompt` may be a list with a list
    of seeds (one generator an image)."""
    import torch
    last = {}

    def grab(p, i, t, k):
        last["latents"] = k["latents"]
        return k
    gen = ([torch.Generator("cpu").manual_seed(s) for s in seed] if isinstance(seed, (list, tuple))
           else torch.Generator("cpu").manual_seed(seed))
    out = pipe(prompt=prompt, height=height, width=width, num_inference_steps=steps, generator=gen, output_type="np",
               callback_on_step_end=grab, **kw)
    image = out.frames if hasattr(out, "frames") else out.images  # a video pipeline: [B, F, H, W, 3]
    return last["latents"].float().numpy(), np.asarray(image)


def call_args(c):
    """(tprun flags, diffusers kwargs) of a pipeline_families.Call."""
    flags, kw = [], dict(c.diffusers_kw)
    for flag, key, value in (("--guidance", "guidance_scale", c.guidance), ("--negative-prompt", "negative_prompt", c.negative),
                             ("--true-cfg-scale", "true_cfg_scale", c.true_cfg),
                             ("--max-sequence-length", "max_sequence_length", c.max_sequence_length),
                             ("--frames", "num_frames", c.frames), ("--guidance-2", "guidance_scale_2", c.guidance_2)):
        if value is not None:
            flags += [flag, str(value)]
            kw[key] = value
    return flags, kw


def tprun_generate(tag, folder, prompt, seed, steps, height, width, flags=(), tp=1):
    """(tensors, png path) of `tprun generate` at tp; (None, why) when it failed. A video (--frames above 1)
    goes to an MP4 and its tensors' "video" is returned as "image" [1, F, H, W, 3]."""
    from safetensors.numpy import load_file
    video = "--frames" in flags and flags[list(flags).index("--frames") + 1] != "1"
    out, png = os.path.join(WORK, f"{tag}.safetensors"), os.path.join(WORK, f"{tag}.{'mp4' if video else 'png'}")
    rc, log = H.run(["generate", "--model", folder, "--prompt", prompt, "--height", str(height), "--width", str(width),
                     "--steps", str(steps), "--seed", str(seed), "--out", png, "--out-tensors", out, *flags], np_=tp)
    if rc != 0:
        return None, f"exit {rc}: {log[-1500:]}"
    got = load_file(out)
    if video:
        got["image"] = got.pop("video")[None]
    return got, png


def compare(fam, label, got, png, ref_latents, ref_image):
    tol = fam.tolerance
    H.within(f"{label} latents", got["latents"], ref_latents, tol["latents"])
    H.within(f"{label} image", got["image"], ref_image, tol["image"])
    if tol.get("png") is not None:
        H.within(f"{label} PNG (levels of 255)", png_pixels(png), np.round(ref_image[0] * 255), tol["png"])


# ---- cases --------------------------------------------------------------------------------------------

def case_registered(fam_classes):
    registered = registered_pipelines(H.tprun)
    print(f"the binary registers {registered}", flush=True)
    found = preset_folders(H.tprun, WORK, registered)  # SystemExit naming a class without a preset
    for cls in registered:
        H.check(folder_class(found[cls][1]) == cls, f"{cls}: init-model --arch {found[cls][0]} writes its folder")
        H.check(cls in FAMILIES, f"{cls}: has a pipeline_families.py entry")
        fam = FAMILIES.get(cls)
        H.check(fam is None or bool(fam.variants and fam.token_cases),
                f"{cls}: its entry has generate variants and tokenizer prompts")
    stale = [c for c in FAMILIES if c not in registered]
    H.check(not stale, f"every pipeline_families.py entry is a registered class (stale: {stale})")


def case_folders(fam):
    import torch
    import time
    d = folder_for(fam.cls)
    pipe = load_pipe(d)
    H.check(type(pipe).__name__ == fam.cls, f"{fam.cls}.from_pretrained loads the init-model folder")
    index = json.load(open(os.path.join(d, "model_index.json")))
    for comp, spec in sorted(index.items()):
        if comp.startswith("_") or not isinstance(spec, list) or spec[1] is None:
            continue
        lib, cls_name = spec
        if "Tokenizer" in cls_name or "Processor" in cls_name:
            got = type(getattr(pipe, comp)).__name__
            H.check(got.startswith(cls_name.replace("Fast", "")), f"{comp} loads as {got} (model_index.json: {cls_name})")
            continue
        if "Scheduler" in cls_name:
            continue
        _, info = getattr(__import__(lib), cls_name).from_pretrained(os.path.join(d, comp), output_loading_info=True)
        allowed = [n for n in info.get("missing_keys", []) if fam.allowed_missing and fam.allowed_missing in str(n)]
        bad = {k: [n for n in info.get(k, []) if n not in allowed]
               for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        bad = {k: v for k, v in bad.items() if v}
        H.check(not bad, f"{comp} ({cls_name}): {lib} loads it with no missing/unexpected/mismatched keys "
                f"{bad or ''}" + (f" ({len(allowed)} '{fam.allowed_missing}' keys missing: tprun never writes them)"
                                  if allowed else ""))
    for tok_key, enc_key in fam.vocab.items():
        tok = getattr(pipe, tok_key)
        tok = getattr(tok, "tokenizer", tok)  # a processor's tokenizer
        rows = getattr(pipe, enc_key).get_input_embeddings().num_embeddings
        exact = tok_key in fam.vocab_exact
        H.check(len(tok) == rows if exact else len(tok) <= rows,
                f"{tok_key}: {len(tok)} tokens {'==' if exact else '<='} {enc_key}'s {rows} embedding rows")
    if fam.folder_check:
        fam.folder_check(H, d)
    for prompts, n in fam.token_cases:
        flags = [] if n is None else ["--max-sequence-length", str(n)]
        same = 0
        for p in prompts:
            r = subprocess.run([H.tprun, "tokenize", "--model", d, "--prompt", p, "--json", *flags],
                               capture_output=True, text=True)
            got = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-500:]}
            want = {k: [int(i) for i in v] for k, v in fam.expected_ids(pipe, p, n).items()}
            ok = all(got.get(k) == v for k, v in want.items())
            same += ok
            if not ok:
                H.check(False, f"tokenize {p[:40]!r} at {n}: tprun {str(got)[:300]} vs {fam.cls} {str(want)[:300]}")
        H.check(same == len(prompts), f"tprun tokenize ids equal {fam.cls}'s on {same} of {len(prompts)} prompts "
                f"(max_sequence_length {n or 'default'})")
    torch.set_num_threads(1)
    pipe(prompt=PROMPT, height=64, width=64, num_inference_steps=2, output_type="np", **fam.folder_call)  # warm-up
    t0 = time.perf_counter()
    out = pipe(prompt=PROMPT, height=64, width=64, num_inference_steps=2,
               generator=torch.Generator().manual_seed(0), output_type="np", **fam.folder_call)
    image = out.frames[0][0] if hasattr(out, "frames") else out.images[0]  # a video's first frame
    dt = time.perf_counter() - t0
    H.check(image.shape == (64, 64, 3) and (image >= 0).all() and (image <= 1).all(),
            f"diffusers makes a 64x64 image in 2 steps, 1 thread: {dt:.3f} s (shape {image.shape}, std {image.std():.3f})")
    torch.set_num_threads(2)


def case_generate(fam, variant=None):
    names = [v.name for v in fam.variants]
    if variant is not None and variant not in names:
        raise SystemExit(f"FAIL: {fam.cls} has no variant {variant!r} ({names})")
    for v in fam.variants:
        if variant is not None and v.name != variant:
            continue
        if v.arch is not None:
            d = init_model(H.tprun, os.path.join(WORK, f"{v.arch}-seed{v.seed}"), v.arch, "--seed", str(v.seed))
        else:
            d = folder_for(fam.cls, v.seed, None if v.edit is None else f"{fam.cls}-{v.name}")
        if v.edit is not None:
            v.edit(d)
        pipe = load_pipe(d)
        if v.check:
            v.check(H, pipe)
        for c in v.calls:
            flags, kw = call_args(c)
            ref_latents, ref_image = diffusers_call(pipe, c.prompt, c.seed, c.steps, c.height, c.width, **kw)
            for tp in c.tps:
                for extra in c.extras:
                    label = f"{fam.cls} {v.name}/{c.name} tp {tp}" + (f" {' '.join(extra)}" if extra else "")
                    tag = label.replace(" ", "_").replace("/", "_").replace("-", "")
                    got, png = tprun_generate(tag, d, c.prompt, c.seed, c.steps, c.height, c.width, [*flags, *extra], tp)
                    if H.check(got is not None, f"{label} ran" + ("" if got else f": {png}")):
                        compare(fam, label, got, png, ref_latents, ref_image)


def case_components(fam):
    if fam.vae_forward is True:
        vae_forward(fam)
    else:
        print(f"n/a  {fam.cls} VAE forward: {fam.vae_forward}", flush=True)
    if "components" in fam.extra_cases:
        fam.extra_cases["components"](H, WORK)


def vae_forward(fam):
    import diffusers
    import torch
    from safetensors.torch import load_file, save_file
    d = folder_for(fam.cls)
    vae_cls = json.load(open(os.path.join(d, "model_index.json")))["vae"][1]
    vae = getattr(diffusers, vae_cls).from_pretrained(os.path.join(d, "vae")).eval()
    g = torch.Generator().manual_seed(5)
    z = torch.randn(1, vae.config.latent_channels, 4, 6, generator=g)
    x = torch.rand(1, 3, 32, 48, generator=g) * 2 - 1
    with torch.no_grad():
        want = {"sample": vae.decode(z).sample, "mean": vae.encode(x).latent_dist.mean,
                "std": vae.encode(x).latent_dist.std}
    for comp, inputs, outs in (("vae_decoder", {"latents": z}, ("sample",)),
                               ("vae_encoder", {"image": x}, ("mean", "std"))):
        inp, out = os.path.join(WORK, f"{comp}_in.safetensors"), os.path.join(WORK, f"{comp}_out.safetensors")
        save_file(inputs, inp)
        rc, log = H.run(["forward", "--model", d, "--component", comp, "--inputs", inp, "--out", out])
        if H.check(rc == 0, f"{vae_cls} {comp} forward ran" + ("" if rc == 0 else f": {log[-800:]}")):
            got = load_file(out)
            for name in outs:
                H.within(f"{vae_cls} {comp} {name} vs diffusers", got[name].numpy(), want[name].numpy(), COMPONENT_TOL)


def case_errors(fam):
    d = folder_for(fam.cls)
    for r in fam.refusals:
        H.refused(r, d, WORK)
    if fam.errors_extra:
        fam.errors_extra(H, WORK, d)


def request_flags(manifest, rid):
    """`generate` flags for request `rid` of `manifest` as the job runs it (the request over [defaults])."""
    with open(manifest, "rb") as f:
        m = tomllib.load(f)
    reqs = os.path.join(os.path.dirname(manifest), m["requests"])
    rec = next(json.loads(line) for line in open(reqs) if line.strip() and json.loads(line)["id"] == rid)
    r = dict(m.get("defaults", {}), **rec)
    flags = [f"--{k.replace('_', '-')}" for k in ("guidance", "max_sequence_length", "negative_prompt",
                                                  "true_cfg_scale") if k in r]
    out = []
    for flag in flags:
        out += [flag, str(r[flag[2:].replace("-", "_")])]
    return r, out


def case_job(fam):
    spec = fam.job
    d = folder_for(fam.cls)
    outs = {}
    for phases in spec.phases:
        out = os.path.join(WORK, f"job-{phases}")
        args = ["run", spec.manifest, "--set", f'model="{d}"', "--out", out, "--progress", "log"]
        if phases is not None:
            args += ["--set", f'schedule.phases="{phases}"']
        for s in spec.sets:
            args += ["--set", s]
        rc, log = H.run(args, np_=4, timeout=600)
        what = phases or "the manifest's"
        if not H.check(rc == 0, f"{os.path.basename(spec.manifest)} at dp 2 x tp 2, phases {what}: exit {rc}"
                       + ("" if rc == 0 else f": {log[-1500:]}")):
            return
        records = [json.loads(line) for line in open(os.path.join(out, "results.jsonl")) if line.strip()]
        H.check(len(records) == spec.requests and all(r["status"] == "done" for r in records)
                and f"{spec.requests} run (0 failed)" in log, f"phases {what}: {len(records)} requests, all done")
        if spec.cache_saved:
            saved = [line for line in log.splitlines() if "saved by the embeddings cache" in line]
            H.check(bool(saved) and " 0 saved" not in saved[0],
                    f"phases {what}, summary: " + (saved[0].split("] ")[-1] if saved else "missing"))
        outs[phases] = (out, args, records)
    first, (out, args, records) = spec.phases[0], outs[spec.phases[-1]]
    images = os.path.join(outs[first][0], "images")
    names = sorted(os.listdir(images)) if os.path.isdir(images) else []  # a video job writes videos/
    for phases in spec.phases[1:]:
        same = [n for n in names if open(os.path.join(outs[first][0], "images", n), "rb").read()
                == open(os.path.join(outs[phases][0], "images", n), "rb").read()]
        H.check(same == names and len(names) == spec.requests,
                f"{phases} and {first} give the same PNG bytes ({len(same)}/{len(names)})")
    if spec.alone:
        r, flags = request_flags(spec.manifest, spec.alone)
        rec = next(x for x in records if x["id"] == spec.alone)
        got, png = tprun_generate("alone", d, r["prompt"], r["seed"], r["steps"], r["height"], r["width"], flags, tp=2)
        if H.check(got is not None, f"generate of {spec.alone} alone ran" + ("" if got else f": {png}")):
            a, b = png_pixels(os.path.join(out, rec["path"])), png_pixels(png)
            H.check(a.shape == b.shape and np.array_equal(a, b),
                    f"{spec.alone} from the job (cached prompt) equals generate alone, byte for byte")
    rc, log = H.run(args, np_=4, timeout=300)
    H.check(rc == 0 and "0 to run" in log, "a rerun resumes with nothing to run")
    r = subprocess.run([H.tprun, "plan", "--model", d, "--world", "4", "--json"], capture_output=True, text=True)
    plan = json.loads(r.stdout) if r.returncode == 0 else {}
    H.check(fam.cls in json.dumps(plan.get("pipeline")) and bool(plan.get("chosen")),
            f"tprun plan sizes the {fam.cls} folder and chooses a plan" + ("" if r.returncode == 0 else r.stderr[-800:]))


def case_batch(fam):
    b = fam.batch
    d = folder_for(fam.cls)
    pipe = load_pipe(d)
    # diffusers: every prompt in one call (padded and masked together), one generator per image.
    latents, _ = diffusers_call(pipe, list(b.prompts), list(b.seeds), b.steps, b.size, b.size)
    for i, (prompt, seed) in enumerate(zip(b.prompts, b.seeds)):
        got, png = tprun_generate(f"alone{i}", d, prompt, seed, b.steps, b.size, b.size)
        if H.check(got is not None, f"prompt {i} alone ran" + ("" if got else f": {png}")):
            H.within(f"prompt {i}: tprun alone vs diffusers' padded batch: latents", got["latents"][0], latents[i],
                     fam.tolerance["latents"])
    job = os.path.join(WORK, "job")
    os.makedirs(job)
    reqs = os.path.join(job, "requests.jsonl")
    with open(reqs, "w") as f:
        for i, (prompt, seed) in enumerate(zip(b.prompts, b.seeds)):
            f.write(json.dumps({"id": f"r{i}", "prompt": prompt, "seed": seed, "height": b.size, "width": b.size,
                                "steps": b.steps}) + "\n")
    manifest, out = os.path.join(job, "job.toml"), os.path.join(job, "out")
    with open(manifest, "w") as f:
        f.write(f'model = "{d}"\ndtype = "fp32"\nrequests = "{reqs}"\n[output]\ndir = "{out}"\n'
                f'formats = ["png"]\nbatch_size = {len(b.prompts)}\n')
    rc, log = H.run(["run", manifest], np_=1, timeout=300)
    if H.check(rc == 0, "the batched job ran" + ("" if rc == 0 else f": {log[-1500:]}")):
        recs = [json.loads(line) for line in open(os.path.join(out, "results.jsonl")) if line.strip()]
        shares = sorted(r["timings"]["denoise_s"] for r in recs if r.get("status") == "done")
        # A batch charges each image an equal share of its denoising time: equal shares = one batch.
        H.check(len(shares) == len(b.prompts) and len(set(shares)) == 1,
                f"every request denoised as one batch (shares {shares})")
        for i in range(len(b.prompts)):
            a = png_pixels(os.path.join(out, "images", f"r{i}.png"))
            H.within(f"request {i}: batched PNG vs the one made alone", a, png_pixels(os.path.join(WORK, f"alone{i}.png")), 1)


def case_long_prompt(fam):
    """A prompt of about 800 text tokens at max_sequence_length n: tokenize, generate and a `run` request take it,
    and the image is diffusers'."""
    n = fam.long_prompt
    d = folder_for(fam.cls)
    prompt = " ".join([PROMPT] * 120)
    r = subprocess.run([H.tprun, "tokenize", "--model", d, "--prompt", prompt, "--max-sequence-length", str(n)],
                       capture_output=True, text=True)
    H.check(r.returncode == 0 and f"{n} used" in r.stdout,
            f"tokenize --max-sequence-length {n}: exit {r.returncode}, {n} tokens reach the transformer"
            + ("" if r.returncode == 0 else f": {r.stderr[-600:]}"))
    ref_latents, ref_image = diffusers_call(load_pipe(d), prompt, 1, 3, 64, 64, max_sequence_length=n)
    got, png = tprun_generate("long", d, prompt, 1, 3, 64, 64, ["--max-sequence-length", str(n)])
    if H.check(got is not None, f"generate --max-sequence-length {n} ran" + ("" if got else f": {png}")):
        compare(fam, f"max_sequence_length {n}, tp 1", got, png, ref_latents, ref_image)
    requests = os.path.join(WORK, "long.jsonl")
    with open(requests, "w") as f:
        f.write(json.dumps({"id": "long", "prompt": prompt, "seed": 1, "steps": 3, "height": 64, "width": 64,
                            "max_sequence_length": n}) + "\n")
    manifest, out = os.path.join(WORK, "long.toml"), os.path.join(WORK, "out")
    with open(manifest, "w") as f:
        f.write(f'model = "{d}"\nrequests = "{requests}"\n[defaults]\nmax_sequence_length = 1024\n'
                f'[output]\ndir = "{out}"\n')
    rc, log = H.run(["run", manifest], np_=1, timeout=300)
    job_png = os.path.join(out, "images", "long.png")
    same = (rc == 0 and os.path.exists(job_png) and got is not None
            and np.array_equal(png_pixels(job_png), png_pixels(png)))
    H.check(bool(same), f"a run request with max_sequence_length {n} ([defaults] 1024): exit {rc}, the image "
            "generate gives" + ("" if rc == 0 else f": {log[-800:]}"))


def not_applicable(name, fam):
    """Why case `name` does not apply to `fam` (its entry's reason), or None."""
    if name == "reference" and "reference" not in fam.extra_cases:
        return f"{fam.cls} has no committed reference case (its parity is against diffusers at test time)"
    if name == "components" and fam.vae_forward is not True and "components" not in fam.extra_cases:
        return fam.vae_forward
    spec = {"errors": fam.refusals, "job": fam.job, "batch": fam.batch, "long_prompt": fam.long_prompt}.get(name)
    return spec if isinstance(spec, str) else None


def run_family_case(name, fam, variant, named):
    """Case `name` for one family. Where it does not apply, the entry's reason: printed when every registered
    class was asked for, a failure when the class was named."""
    why = not_applicable(name, fam)
    if why is not None:
        if named:
            H.check(False, f"{name} was asked for {fam.cls}, which it does not apply to: {why}")
        else:
            print(f"n/a  {fam.cls} {name}: {why}", flush=True)
        return
    if name == "generate":
        case_generate(fam, variant)
    elif name == "reference":
        fam.extra_cases["reference"](H, WORK)
    else:
        {"folders": case_folders, "components": case_components, "errors": case_errors, "job": case_job,
         "batch": case_batch, "long_prompt": case_long_prompt}[name](fam)


CASES = ("folders", "generate", "components", "reference", "errors", "job", "batch", "long_prompt")


def main():
    global H
    H = ParityHarness(sys.argv[1], sys.argv[2])
    case, targets = sys.argv[3], sys.argv[4:]

    def body(work):
        global WORK
        WORK = work
        if case == "registered":
            return case_registered(targets)
        named = bool(targets)
        for target in targets or registered_pipelines(H.tprun):
            cls, _, variant = target.partition(":")
            print(f"---- {case} {target}", flush=True)
            WORK = os.path.join(work, target.replace(":", "-"))  # each family's files apart
            os.makedirs(WORK, exist_ok=True)
            run_family_case(case, family(cls), variant or None, named)
    if case != "registered" and case not in CASES:
        raise SystemExit(f"usage: pipeline_parity.py TPRUN MPIRUN CASE [CLASS[:VARIANT] ...]; CASE: registered, "
                         f"{', '.join(CASES)}")
    return run_cases(H, {case: body}, f"tprun-pipeline-parity-{case}")


if __name__ == "__main__":
    sys.exit(main())
