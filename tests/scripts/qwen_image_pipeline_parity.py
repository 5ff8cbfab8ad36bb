#!/usr/bin/env python3
"""Qwen-Image text to image end to end against the real diffusers QwenImagePipeline, on folders
`tprun init-model --arch qwen-image` writes (random weights, a tokenizer learned from the bundled
text in the hub's slow layout, no download).

Cases (one ctest entry each; `qwen_image_pipeline_parity.py TPRUN MPIRUN CASE`):
  folders   every component loads in diffusers / transformers with no missing, unexpected or
            mismatched key of what tprun reads (the text encoder's vision tower is not written:
            transformers draws it; it is reported missing and nothing else may be), the tokenizer
            loads as Qwen2Tokenizer from vocab.json + merges.txt, and `tprun tokenize` gives the ids
            of the pipeline's template for a short and a long prompt.
  generate  `tprun generate` vs QwenImagePipeline(prompt, seed), fp32, 3 steps, 64 x 64 and 48 x 80:
            without CFG (no negative prompt) and with true CFG (a negative prompt, true_cfg_scale 4:
            the norm rescale), at tp 1 and 2; final packed latents (diffusers' latents at the last
            step, through callback_on_step_end) within 1e-3, the float image within 2e-3 and the PNG
            bytes within 2 of diffusers' uint8 image.
  batch     a batch of two prompts of different token lengths in one `tprun run` job (the shorter
            one's text padded and masked) gives each image as `tprun generate` gives it alone, and
            diffusers' batched call gives the same latents within 1e-3.
  job       jobs/qwen-image-demo.toml at dp 2 x tp 2 together and staged: every request done, the
            same PNG bytes both ways, a rerun runs nothing; `tprun plan` sizes the folder.
  errors    refused on every rank before any weight byte, no hang: a tokenizer without the
            template's <|im_start|>, a transformer whose joint_attention_dim is not the encoder's
            hidden size, max_sequence_length 1025.
  long_prompt  a prompt of about 800 tokens at max_sequence_length 600 (past FLUX.1's 512): tokenize,
            generate (against diffusers, tp 1) and a `run` request with [defaults] max_sequence_length
            1024 (the same image as generate's).
"""
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, run_cases  # noqa: E402

LATENT_TOL = 1e-3
IMAGE_TOL = 2e-3
PNG_TOL = 2
PROMPT = "a red fox in fresh snow, watercolor"
NEGATIVE = "blurry, low quality"
H = None  # tprun_harness.Harness, set in main()
ROOT = os.environ.get("TPRUN_SRC", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def diffusers_run(folder, prompt, negative=None, seed=1, steps=3, height=64, width=64, max_sequence_length=512):
    from diffusers import QwenImagePipeline
    pipe = QwenImagePipeline.from_pretrained(folder, dtype=torch.float32)
    last = {}

    def grab(p, i, t, kw):
        last["latents"] = kw["latents"]
        return kw

    kwargs = dict(height=height, width=width, num_inference_steps=steps, output_type="np",
                  max_sequence_length=max_sequence_length,
                  callback_on_step_end=grab, generator=torch.Generator("cpu").manual_seed(seed))
    if negative is not None:
        kwargs.update(negative_prompt=negative, true_cfg_scale=4.0)
    image = pipe(prompt=prompt, **kwargs).images
    return last["latents"], torch.from_numpy(np.asarray(image))


def tprun_generate(work, folder, tp, tag, prompt=PROMPT, negative=None, seed=1, steps=3, height=64, width=64,
                   extra=()):
    out = os.path.join(work, f"{tag}.safetensors")
    png = os.path.join(work, f"{tag}.png")
    args = ["generate", "--model", folder, "--prompt", prompt, "--height", str(height), "--width", str(width),
            "--steps", str(steps), "--seed", str(seed), "--out", png, "--out-tensors", out, *extra]
    if negative is not None:
        args += ["--negative-prompt", negative, "--true-cfg-scale", "4"]
    rc, log = H.run(args, np_=tp)
    if rc != 0:
        return None, f"exit {rc}: {log[-1500:]}"
    return load_file(out), png


def compare(label, got, png, ref_latents, ref_image):
    dl = (got["latents"] - ref_latents).abs().max().item()
    di = (got["image"] - ref_image).abs().max().item()
    ref_u8 = np.round(ref_image.numpy()[0] * 255).astype(np.int16)
    png_u8 = np.asarray(Image.open(png).convert("RGB")).astype(np.int16)
    dp = int(np.abs(png_u8 - ref_u8).max())
    H.check(dl <= LATENT_TOL and di <= IMAGE_TOL and dp <= PNG_TOL,
            f"{label}: latents max abs diff {dl:.3g} (tol {LATENT_TOL}), image {di:.3g} (tol {IMAGE_TOL}), "
            f"PNG {dp} of 255 (tol {PNG_TOL})")


def case_folders(work):
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
    d = H.init_model(work, "qwen-image")
    for sub, cls in (("transformer", QwenImageTransformer2DModel), ("vae", AutoencoderKLQwenImage)):
        _, info = cls.from_pretrained(os.path.join(d, sub), output_loading_info=True)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        H.check(not bad, f"{sub}: diffusers loads it with no missing/unexpected keys {bad or ''}")
    _, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(os.path.join(d, "text_encoder"),
                                                                output_loading_info=True)
    missing = [k for k in info.get("missing_keys", []) if "visual" not in k]
    bad = {"missing (not visual)": missing, "unexpected": list(info.get("unexpected_keys", [])),
           "mismatched": list(info.get("mismatched_keys", []))}
    bad = {k: v for k, v in bad.items() if v}
    H.check(not bad, f"text_encoder: transformers loads the language model with no missing/unexpected keys {bad or ''}")
    H.check(not os.path.exists(os.path.join(d, "tokenizer", "tokenizer.json")),
            "the tokenizer folder is the hub's slow layout (no tokenizer.json)")
    tok = AutoTokenizer.from_pretrained(os.path.join(d, "tokenizer"))
    H.check(type(tok).__name__.startswith("Qwen2Tokenizer"), f"tokenizer loads as {type(tok).__name__}")
    from diffusers import QwenImagePipeline
    pipe = QwenImagePipeline.from_pretrained(d, dtype=torch.float32)
    for prompt in (PROMPT, " ".join([PROMPT] * 40)):
        want = tok([pipe.prompt_template_encode.format(prompt)], max_length=pipe.tokenizer_max_length + 34,
                   padding=True, truncation=True)["input_ids"][0]
        r = subprocess.run([H.tprun, "tokenize", "--model", d, "--prompt", prompt, "--json"], capture_output=True,
                           text=True)
        got = json.loads(r.stdout)["tokenizer"] if r.returncode == 0 else r.stderr
        H.check(got == [int(i) for i in want], f"tprun tokenize ids equal QwenImagePipeline's ({len(want)} ids)")


def case_generate(work):
    d = H.init_model(work, "qwen-image")
    for negative in (None, NEGATIVE):
        for height, width in ((64, 64), (48, 80)):
            ref_latents, ref_image = diffusers_run(d, PROMPT, negative, height=height, width=width)
            for tp in (1, 2):
                label = f"{'cfg' if negative else 'nocfg'} {height}x{width} tp {tp}"
                got, png = tprun_generate(work, d, tp, label.replace(" ", "_"), negative=negative, height=height,
                                          width=width)
                if H.check(got is not None, f"{label} ran" + ("" if got else f": {png}")):
                    compare(label, got, png, ref_latents, ref_image)


def case_batch(work):
    from diffusers import QwenImagePipeline
    d = H.init_model(work, "qwen-image")
    prompts = ["a cat", "a lighthouse on a cliff at dusk, oil painting, warm light, long shadows"]
    # diffusers: both prompts in one call (padded and masked together), one generator per image.
    pipe = QwenImagePipeline.from_pretrained(d, dtype=torch.float32)
    last = {}

    def grab(p, i, t, kw):
        last["latents"] = kw["latents"]
        return kw

    pipe(prompt=prompts, height=64, width=64, num_inference_steps=3, output_type="np", callback_on_step_end=grab,
         generator=[torch.Generator("cpu").manual_seed(s) for s in (5, 6)])
    for i, (prompt, seed) in enumerate(zip(prompts, (5, 6))):
        got, png = tprun_generate(work, d, 1, f"alone{i}", prompt=prompt, seed=seed)
        if H.check(got is not None, f"prompt {i} alone ran" + ("" if got else f": {png}")):
            dl = (got["latents"][0] - last["latents"][i]).abs().max().item()
            H.check(dl <= LATENT_TOL, f"prompt {i}: tprun alone vs diffusers' padded batch: latents {dl:.3g}")
    # tprun: the same two requests batched in one job.
    job = os.path.join(work, "job")
    os.makedirs(job)
    reqs = os.path.join(job, "requests.jsonl")
    with open(reqs, "w") as f:
        for i, (prompt, seed) in enumerate(zip(prompts, (5, 6))):
            f.write(json.dumps({"id": f"r{i}", "prompt": prompt, "seed": seed, "height": 64, "width": 64,
                                "steps": 3}) + "\n")
    manifest = os.path.join(job, "job.toml")
    out = os.path.join(job, "out")
    with open(manifest, "w") as f:
        f.write(f'model = "{d}"\ndtype = "fp32"\nrequests = "{reqs}"\n[output]\ndir = "{out}"\n'
                f'formats = ["png"]\nbatch_size = 2\n')
    rc, log = H.run(["run", manifest], np_=1, timeout=300)
    if H.check(rc == 0, "the batched job ran" + ("" if rc == 0 else f": {log[-1500:]}")):
        recs = [json.loads(line) for line in open(os.path.join(out, "results.jsonl")) if line.strip()]
        shares = sorted(r["timings"]["denoise_s"] for r in recs if r.get("status") == "done")
        # A batch charges each image an equal share of its denoising time: equal shares = one batch.
        H.check(len(shares) == 2 and shares[0] == shares[1], f"both requests denoised as one batch (shares {shares})")
        for i in range(2):
            a = np.asarray(Image.open(os.path.join(out, "images", f"r{i}.png")).convert("RGB")).astype(np.int16)
            b = np.asarray(Image.open(os.path.join(work, f"alone{i}.png")).convert("RGB")).astype(np.int16)
            H.check(int(np.abs(a - b).max()) <= 1, f"request {i}: batched PNG equals the one made alone (within 1)")


def case_job(work):
    d = H.init_model(work, "qwen-image")
    manifest = os.path.join(ROOT, "jobs", "qwen-image-demo.toml")
    outs = {}
    for phases in ("together", "staged"):
        out = os.path.join(work, f"out-{phases}")
        rc, log = H.run(["run", manifest, "--set", f'model="{d}"', "--out", out, "--set",
                         f'schedule.phases="{phases}"'], np_=4, timeout=300)
        if not H.check(rc == 0 and "8 run (0 failed)" in log,
                       f"jobs/qwen-image-demo.toml at dp 2 x tp 2, phases {phases}: 8 done" +
                       ("" if rc == 0 else f": {log[-1500:]}")):
            return
        outs[phases] = out
    names = sorted(os.listdir(os.path.join(outs["together"], "images")))
    same = [n for n in names
            if open(os.path.join(outs["together"], "images", n), "rb").read() ==
            open(os.path.join(outs["staged"], "images", n), "rb").read()]
    H.check(len(names) == 8 and same == names, f"staged and together give the same PNG bytes ({len(same)}/8)")
    rc, log = H.run(["run", manifest, "--set", f'model="{d}"', "--out", outs["staged"], "--set",
                     'schedule.phases="staged"'], np_=4, timeout=300)
    H.check(rc == 0 and "0 to run" in log, "a rerun resumes with nothing to run")
    r = subprocess.run([H.tprun, "plan", "--model", d, "--world", "4", "--json"], capture_output=True, text=True)
    ok = r.returncode == 0
    plan = json.loads(r.stdout) if ok else {}
    H.check(ok and "QwenImagePipeline" in json.dumps(plan.get("pipeline")) and plan.get("chosen"),
            "tprun plan sizes a Qwen-Image folder and chooses a plan" + ("" if ok else f": {r.stderr[-800:]}"))


def expect_refusal(label, folder, want, extra=(), np_=2):
    png = os.path.join(os.path.dirname(folder), "refused.png")
    # Two steps: the scheduler's shift_terminal refuses one.
    rc, log = H.run(["generate", "--model", folder, "--prompt", PROMPT, "--height", "64", "--width", "64",
                     "--steps", "2", "--out", png, *extra], np_=np_, timeout=120)
    H.check(rc != 0 and want in log, f"{label}: refused (exit {rc}) naming '{want}'" +
            ("" if rc != 0 and want in log else f": {log[-800:]}"))


def case_errors(work):
    d = H.init_model(work, "qwen-image")
    bad = os.path.join(work, "no_im_start")
    shutil.copytree(d, bad)
    # The token renamed everywhere the tokenizer folder names it (same ids, same vocabulary size).
    for name in ("tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"):
        path = os.path.join(bad, "tokenizer", name)
        if os.path.exists(path):
            text = open(path).read().replace("<|im_start|>", "<|im_begin|>")
            open(path, "w").write(text)
    expect_refusal("a tokenizer without <|im_start|>", bad, "<|im_start|>")
    bad2 = os.path.join(work, "joint_dim")
    shutil.copytree(d, bad2)
    tcfg_path = os.path.join(bad2, "transformer", "config.json")
    tcfg = json.load(open(tcfg_path))
    tcfg["joint_attention_dim"] = tcfg["joint_attention_dim"] * 2
    json.dump(tcfg, open(tcfg_path, "w"))
    expect_refusal("joint_attention_dim != the encoder's hidden size", bad2, "joint_attention_dim")
    expect_refusal("max_sequence_length 1025", d, "--max-sequence-length: 1025 is beyond QwenImagePipeline's limit of 1024",
                   ["--max-sequence-length", "1025"])


def case_long_prompt(work):
    """A prompt of about 800 text tokens at max_sequence_length 600 (past FLUX.1's 512, within Qwen-Image's
    1024): tokenize, generate and a `run` request all take it, and the image is diffusers'."""
    d = H.init_model(work, "qwen-image")
    prompt = " ".join([PROMPT] * 120)
    r = subprocess.run([H.tprun, "tokenize", "--model", d, "--prompt", prompt, "--max-sequence-length", "600"],
                       capture_output=True, text=True)
    H.check(r.returncode == 0 and "600 used" in r.stdout,
            f"tokenize --max-sequence-length 600: exit {r.returncode}, 600 tokens reach the transformer"
            + ("" if r.returncode == 0 else f": {r.stderr[-600:]}"))
    ref_latents, ref_image = diffusers_run(d, prompt, max_sequence_length=600)
    got, png = tprun_generate(work, d, 1, "long", prompt=prompt, extra=["--max-sequence-length", "600"])
    if H.check(got is not None, "generate --max-sequence-length 600 ran" + ("" if got else f": {png}")):
        compare("max_sequence_length 600, tp 1", got, png, ref_latents, ref_image)
    requests = os.path.join(work, "long.jsonl")
    with open(requests, "w") as f:
        f.write(json.dumps({"id": "long", "prompt": prompt, "seed": 1, "steps": 3, "height": 64, "width": 64,
                            "max_sequence_length": 600}) + "\n")
    manifest = os.path.join(work, "long.toml")
    out = os.path.join(work, "out")
    with open(manifest, "w") as f:
        f.write(f'model = "{d}"\nrequests = "{requests}"\n[defaults]\nmax_sequence_length = 1024\n'
                f'[output]\ndir = "{out}"\n')
    rc, log = H.run(["run", manifest], np_=1, timeout=300)
    job_png = os.path.join(out, "images", "long.png")
    ok = rc == 0 and os.path.exists(job_png) and png and os.path.exists(png)
    same = ok and np.array_equal(np.asarray(Image.open(job_png).convert("RGB")),
                                 np.asarray(Image.open(png).convert("RGB")))
    H.check(bool(same), f"a run request with max_sequence_length 600 ([defaults] 1024): exit {rc}, the image "
            "generate gives" + ("" if rc == 0 else f": {log[-800:]}"))


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {"folders": case_folders, "generate": case_generate, "batch": case_batch,
                         "errors": case_errors, "job": case_job, "long_prompt": case_long_prompt},
                     "tprun-qwen-image-pipeline")


if __name__ == "__main__":
    sys.exit(main())
