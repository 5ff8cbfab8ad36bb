#!/usr/bin/env python3
"""FLUX.2 text to image end to end against the real diffusers pipelines, on folders `tprun init-model`
writes (random weights, tokenizers learned from the bundled text, no download).

Cases (one ctest entry each; `flux2_pipeline_parity.py TPRUN MPIRUN CASE`):
  folders   `init-model --arch flux2-klein | flux2-dev`: every component loads in diffusers /
            transformers with no missing or unexpected key (output_loading_info), the tokenizer
            loads as the class model_index.json names (Qwen2TokenizerFast, PixtralProcessor), and
            `tprun tokenize` gives the templated ids the pipeline's encode step gives.
  klein     `tprun generate` vs Flux2KleinPipeline(prompt, seed), fp32, at tp 1 and 2: true CFG
            (guidance 4, the empty negative prompt), no CFG (guidance 1) and a distilled folder
            (is_distilled: guidance 4 without CFG); final packed latents (diffusers' latents at the
            last step, through callback_on_step_end) and the image (output_type "np") within 1e-3.
  dev       the same against Flux2Pipeline (Mistral3 text encoder, distilled guidance embedding), at
            tp 1 and 2, the text encoder sharded (the default) and replicated.
  vae       `tprun forward --component vae_decoder | vae_encoder` vs AutoencoderKLFlux2.decode /
            .encode(...).latent_dist (mean, std) on the init-model folder, within 1e-4.
  errors    refused on every rank before any weight byte, no hang: a tokenizer folder whose chat
            template tprun does not know, a text encoder whose KV heads tp does not divide (2 KV heads
            at tp 4), a folder with neither tokenizer.json nor vocab.json (without tokenizer.json alone the
            vocab.json + merges.txt layout gives the same ids).
  job       `tprun run jobs/flux2-klein-demo.toml` at dp 2 x tp 2 (batch_size 1): every request done, the summary
            counts the encodes the prompt cache saved, a request's PNG equals `tprun generate` of the
            same prompt and seed at tp 2 (cache hit vs fresh encode: identical bytes), a rerun runs
            nothing.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness  # noqa: E402

TOL = 1e-3
COMPONENT_TOL = 1e-4
PROMPT = "a red fox in fresh snow, watercolor"
H = None  # tprun_harness.Harness, set in main()
ROOT = os.environ.get("TPRUN_SRC", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))








def pipeline_class(folder):
    from diffusers import Flux2KleinPipeline, Flux2Pipeline
    cls = json.load(open(os.path.join(folder, "model_index.json")))["_class_name"]
    return Flux2KleinPipeline if cls == "Flux2KleinPipeline" else Flux2Pipeline


def diffusers_run(folder, guidance, seed=1, steps=3, size=64):
    pipe = pipeline_class(folder).from_pretrained(folder, dtype=torch.float32)
    last = {}

    def grab(p, i, t, kw):
        last["latents"] = kw["latents"]
        return kw

    image = pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=steps, guidance_scale=guidance,
                 generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                 callback_on_step_end=grab).images
    return last["latents"], torch.from_numpy(np.asarray(image))


def tprun_generate(work, folder, guidance, tp, tag, extra=(), seed=1, steps=3, size=64):
    out = os.path.join(work, f"{tag}.safetensors")
    png = os.path.join(work, f"{tag}.png")
    rc, log = H.run(["generate", "--model", folder, "--prompt", PROMPT, "--height", str(size), "--width", str(size),
                   "--steps", str(steps), "--guidance", str(guidance), "--seed", str(seed), "--out", png,
                   "--out-tensors", out, *extra], np_=tp)
    if rc != 0:
        return None, f"exit {rc}: {log[-1500:]}"
    return load_file(out), png


def compare_generate(work, folder, label, guidance, tps=(1, 2), extras=((),)):
    ref_latents, ref_image = diffusers_run(folder, guidance)
    for tp in tps:
        for extra in extras:
            tag = f"{label}_tp{tp}{'_'.join(extra).replace('-', '')}"
            got, png = tprun_generate(work, folder, guidance, tp, tag, extra)
            if not H.check(got is not None, f"{label} tp {tp} {' '.join(extra)} ran" + ("" if got else f": {png}")):
                continue
            dl = (got["latents"] - ref_latents).abs().max().item()
            di = (got["image"] - ref_image).abs().max().item()
            H.check(dl <= TOL and di <= TOL,
                  f"{label} tp {tp} {' '.join(extra)}: latents max abs diff {dl:.3g}, image {di:.3g} (tolerance {TOL})")


def case_folders(work):
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import AutoProcessor, AutoTokenizer, Mistral3ForConditionalGeneration, Qwen3ForCausalLM
    for arch, te_cls in (("flux2-klein", Qwen3ForCausalLM), ("flux2-dev", Mistral3ForConditionalGeneration)):
        d = H.init_model(work, arch)
        for sub, cls in (("transformer", Flux2Transformer2DModel), ("vae", AutoencoderKLFlux2)):
            _, info = cls.from_pretrained(os.path.join(d, sub), output_loading_info=True)
            bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
            H.check(not bad, f"{arch} {sub}: diffusers loads it with no missing/unexpected keys {bad or ''}")
        _, info = te_cls.from_pretrained(os.path.join(d, "text_encoder"), output_loading_info=True)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        H.check(not bad, f"{arch} text_encoder: transformers loads it with no missing/unexpected keys {bad or ''}")
        tok_cls = json.load(open(os.path.join(d, "model_index.json")))["tokenizer"][1]
        loader = AutoProcessor if tok_cls == "PixtralProcessor" else AutoTokenizer
        tok = loader.from_pretrained(os.path.join(d, "tokenizer"))
        H.check(type(tok).__name__.startswith(tok_cls.replace("Fast", "")),
              f"{arch} tokenizer loads as {type(tok).__name__} (model_index.json: {tok_cls})")
        # `tprun tokenize` gives the ids the pipeline's own encode step gives.
        pipe_cls = pipeline_class(d)
        if tok_cls == "PixtralProcessor":
            from diffusers.pipelines.flux2.pipeline_flux2 import format_input
            want = tok.apply_chat_template(format_input([PROMPT]), add_generation_prompt=False, tokenize=True,
                                           return_dict=True, padding="max_length", truncation=True,
                                           max_length=96)["input_ids"][0]
        else:
            text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                           add_generation_prompt=True, enable_thinking=False)
            want = tok(text, padding="max_length", truncation=True, max_length=96)["input_ids"]
        r = subprocess.run([H.tprun, "tokenize", "--model", d, "--prompt", PROMPT, "--max-sequence-length", "96",
                            "--json"], capture_output=True, text=True)
        got = json.loads(r.stdout)["tokenizer"] if r.returncode == 0 else r.stderr
        H.check(got == [int(i) for i in want], f"{arch}: tprun tokenize ids equal {pipe_cls.__name__}'s ({len(want)} ids)")


def case_klein(work):
    d = H.init_model(work, "flux2-klein")
    compare_generate(work, d, "klein_cfg", 4.0)
    compare_generate(work, d, "klein_nocfg", 1.0)
    dist = os.path.join(work, "klein-distilled")
    shutil.copytree(d, dist)
    index = json.load(open(os.path.join(dist, "model_index.json")))
    index["is_distilled"] = True
    json.dump(index, open(os.path.join(dist, "model_index.json"), "w"), indent=2)
    compare_generate(work, dist, "klein_distilled", 4.0)


def case_dev(work):
    d = H.init_model(work, "flux2-dev")
    compare_generate(work, d, "dev", 4.0, extras=((), ("--replicate-text-encoders",)))


def case_vae(work):
    from diffusers import AutoencoderKLFlux2
    d = H.init_model(work, "flux2-klein")
    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(d, "vae")).eval()
    g = torch.Generator().manual_seed(5)
    z = torch.randn(1, vae.config.latent_channels, 4, 6, generator=g)
    x = torch.rand(1, 3, 32, 48, generator=g) * 2 - 1
    with torch.no_grad():
        want = {"sample": vae.decode(z).sample, "mean": vae.encode(x).latent_dist.mean,
                "std": vae.encode(x).latent_dist.std}
    for comp, inputs, outs in (("vae_decoder", {"latents": z}, ("sample",)), ("vae_encoder", {"image": x}, ("mean", "std"))):
        inp, out = os.path.join(work, f"{comp}_in.safetensors"), os.path.join(work, f"{comp}_out.safetensors")
        save_file(inputs, inp)
        rc, log = H.run(["forward", "--model", d, "--component", comp, "--inputs", inp, "--out", out])
        if not H.check(rc == 0, f"{comp} forward ran" + ("" if rc == 0 else f": {log[-800:]}")):
            continue
        got = load_file(out)
        for name in outs:
            diff = (got[name] - want[name]).abs().max().item()
            H.check(diff <= COMPONENT_TOL, f"{comp} {name}: max abs diff vs diffusers {diff:.3g} (tolerance {COMPONENT_TOL})")


def expect_refusal(label, folder, np_, want, code):
    rc, log = H.run(["generate", "--model", folder, "--prompt", "x", "--height", "64", "--width", "64", "--steps", "1",
                   "--out", "never.png"], np_=np_, timeout=120)
    lines = [l for l in log.splitlines() if want in l]
    H.check(rc == code and len(lines) >= np_ and "bytes on this rank" not in log,
          f"{label}: exit {rc} (want {code}), '{want}' on {len(lines)} of {np_} ranks, no weights loaded")


def case_errors(work):
    d = H.init_model(work, "flux2-klein")
    bad = os.path.join(work, "bad-template")
    shutil.copytree(d, bad)
    cfg_path = os.path.join(bad, "tokenizer", "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    jinja = os.path.join(bad, "tokenizer", "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja) as f:
            text = f.read()
        with open(jinja, "w") as f:
            f.write(text.replace("<|im_start|>", "<|im_begin|>"))
    else:
        cfg["chat_template"] = cfg["chat_template"].replace("<|im_start|>", "<|im_begin|>")
        json.dump(cfg, open(cfg_path, "w"), indent=2)
    expect_refusal("unknown chat template", bad, 2, "is not one tprun knows", 4)
    expect_refusal("KV heads tp does not divide", d, 4, "does not divide num_key_value_heads 2", 3)
    # Without tokenizer.json the folder's vocab.json + merges.txt are read, as transformers builds
    # Qwen2TokenizerFast from them: the same ids. Without those too, a refusal naming the files.
    missing = os.path.join(work, "no-tokenizer-json")
    shutil.copytree(d, missing)
    os.remove(os.path.join(missing, "tokenizer", "tokenizer.json"))

    def ids(folder):
        r = subprocess.run([H.tprun, "tokenize", "--model", folder, "--prompt", PROMPT, "--max-sequence-length", "64",
                            "--json"], capture_output=True, text=True)
        return json.loads(r.stdout)["tokenizer"] if r.returncode == 0 else r.stderr[-500:]
    want, got = ids(d), ids(missing)
    H.check(isinstance(got, list) and got == want,
            f"no tokenizer.json: vocab.json + merges.txt give the same ids ({got if not isinstance(got, list) else len(got)})")
    os.remove(os.path.join(missing, "tokenizer", "vocab.json"))
    expect_refusal("missing tokenizer.json and vocab.json", missing, 2, "tokenizer.json", 4)


def case_job(work):
    model = H.init_model(work, "flux2-klein")
    out = os.path.join(work, "job-out")
    manifest = os.path.join(ROOT, "jobs", "flux2-klein-demo.toml")
    # batch_size 1: a batched image may differ from the unbatched one by float rounding, and this
    # check is about the cache (a hit must give the bytes a fresh encode gives).
    args = ["run", manifest, "--set", f'model="{model}"', "--set", "output.batch_size=1", "--out", out,
            "--progress", "log"]
    rc, log = H.run(args, np_=4, timeout=600)
    if not H.check(rc == 0, f"job at dp 2 x tp 2: exit {rc}" + ("" if rc == 0 else f": {log[-1500:]}")):
        return
    records = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
    H.check(all(r["status"] == "done" for r in records) and len(records) == 15, f"{len(records)} requests, all done")
    saved = [l for l in log.splitlines() if "saved by the embeddings cache" in l]
    H.check(bool(saved) and " 0 saved" not in saved[0], "summary: " + (saved[0].split("] ")[-1] if saved else "missing"))
    rec = next(r for r in records if r["id"] == "fox-seed-2")
    got, png = tprun_generate(work, model, 4.0, 2, "alone", seed=2, steps=4, size=64,
                              extra=("--max-sequence-length", "64"))
    if H.check(got is not None, "generate of fox-seed-2 alone ran"):
        from PIL import Image
        a = np.asarray(Image.open(os.path.join(out, rec["path"])))
        b = np.asarray(Image.open(png))
        H.check(a.shape == b.shape and np.array_equal(a, b),
              "fox-seed-2 from the job (cached prompt) equals generate alone, byte for byte")
    rc, log = H.run(args, np_=4, timeout=300)
    H.check(rc == 0 and "0 to run" in log, "a rerun resumes with nothing to run")


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    case = sys.argv[3]
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix=f"tprun-flux2-pipeline-{case}-")
    try:
        {"folders": case_folders, "klein": case_klein, "dev": case_dev, "vae": case_vae, "errors": case_errors,
         "job": case_job}[case](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'FAILED' if H.failures else 'OK'}: {H.failures} failure(s)")
    return 1 if H.failures else 0


if __name__ == "__main__":
    sys.exit(main())
