#!/usr/bin/env python3
"""`tprun generate` against diffusers' FluxPipeline, two ways.

reference   the shared/ref `flux_pipeline` case (tests/data/flux_pipeline):
            given prompt embeddings and initial latents, 3 steps; `tprun
            generate --inputs ... --out-tensors ...` under mpirun at tp 1 and 2;
            final latents and NHWC image within 1e-3 of the stored expectation,
            and the PNG within one level of expected.png.
init_model  a folder written by `tprun init-model --preset tiny` is loaded by
            the real FluxPipeline.from_pretrained (its own CLIP/T5 classes and
            tokenizers), which proves diffusers reads what tprun writes; the
            same prompt and seed then run through diffusers (CPU generator) and
            through `tprun generate` at tp 1 and 2: latents and image within
            1e-3; a negative prompt with true_cfg_scale 3 likewise; and
            `tprun tokenize --json` gives the ids diffusers' tokenizers give.

components  `tprun forward --component text_encoder|text_encoder_2|vae_decoder|
            vae_encoder` on the shared/ref component cases (1e-4; T5 at tp 2), and
            `tprun verify --component text_encoder_2 --tp 2`.

schnell     the init-model folder rewritten as FLUX.1-schnell differs from dev
            (guidance_embeds false, no guidance embedder, scheduler shift 1.0 without
            dynamic shifting): diffusers vs `tprun generate` at tp 1 and 2.

usage: pipeline_parity.py TPRUN MPIRUN CASE   (CASE: reference | init_model | components | schnell)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

TOL = 1e-3
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "flux_pipeline")


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"command failed with exit code {p.returncode}")
    return p.stdout


def mpirun(mpi, np_, tprun, *args):
    return run([mpi, "-np", str(np_), "--oversubscribe", tprun, *args])


def png_pixels(path):
    from PIL import Image
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int32)


def compare(name, got, want, tol=TOL):
    d = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    print(f"{name}: max abs diff {d:.3g} (tolerance {tol})", flush=True)
    if not d <= tol:
        raise SystemExit(f"FAIL: {name} differs by {d:.3g} > {tol}")


def reference(tprun, mpi, tmp):
    want = load_file(os.path.join(DATA, "expected.safetensors"))
    for np_ in (1, 2):
        out = os.path.join(tmp, f"ref_tp{np_}.safetensors")
        png = os.path.join(tmp, f"ref_tp{np_}.png")
        mpirun(mpi, np_, tprun, "generate", "--model", os.path.join(DATA, "model"), "--inputs",
               os.path.join(DATA, "inputs.safetensors"), "--height", "32", "--width", "32", "--steps", "3",
               "--guidance", "3.5", "--out-tensors", out, "--out", png)
        got = load_file(out)
        compare(f"tp {np_} latents", got["latents"], want["latents"])
        compare(f"tp {np_} image", got["image"], want["image"])
        compare(f"tp {np_} png", png_pixels(png), png_pixels(os.path.join(DATA, "expected.png")), 1)
        from PIL import Image
        info = Image.open(png).info
        assert info.get("steps") == "3" and info.get("guidance") == "3.5", info


def init_model(tprun, mpi, tmp):
    import torch
    from diffusers import FluxPipeline

    torch.set_num_threads(1)
    folder = os.path.join(tmp, "tiny")
    run([tprun, "init-model", folder, "--arch", "flux", "--preset", "tiny"])
    pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    print("diffusers loaded", folder, "->", type(pipe).__name__, flush=True)

    prompts = ["a red fox in the snow, watercolor", "Two cats; one sleeping. 42 lanterns!", ""]
    for p in prompts:
        ids = json.loads(run([tprun, "tokenize", "--model", folder, "--prompt", p, "--json",
                              "--max-sequence-length", "64"]))
        a = pipe.tokenizer(p, padding="max_length", max_length=77, truncation=True).input_ids
        b = pipe.tokenizer_2(p, padding="max_length", max_length=64, truncation=True,
                             add_special_tokens=True).input_ids
        assert ids["tokenizer"] == a, (p, ids["tokenizer"], a)
        assert ids["tokenizer_2"] == b, (p, ids["tokenizer_2"], b)
    print("tokenize: ids equal diffusers' tokenizers on", len(prompts), "prompts", flush=True)

    cases = [
        dict(name="distilled", prompt="a red fox in the snow, watercolor", seed=7, extra=[], kw={}),
        dict(name="true_cfg", prompt="a lighthouse at dusk", seed=11,
             extra=["--negative-prompt", "blurry, low quality", "--true-cfg-scale", "3"],
             kw=dict(negative_prompt="blurry, low quality", true_cfg_scale=3.0)),
    ]
    for c in cases:
        common = dict(prompt=c["prompt"], height=64, width=64, num_inference_steps=4, guidance_scale=3.5,
                      max_sequence_length=64, **c["kw"])
        lat = pipe(**common, generator=torch.Generator("cpu").manual_seed(c["seed"]), output_type="latent").images
        img = pipe(**common, generator=torch.Generator("cpu").manual_seed(c["seed"]), output_type="np").images
        for np_ in (1, 2):
            out = os.path.join(tmp, f"{c['name']}_tp{np_}.safetensors")
            mpirun(mpi, np_, tprun, "generate", "--model", folder, "--prompt", c["prompt"], "--height", "64",
                   "--width", "64", "--steps", "4", "--guidance", "3.5", "--seed", str(c["seed"]),
                   "--max-sequence-length", "64", "--out-tensors", out, "--out",
                   os.path.join(tmp, f"{c['name']}_tp{np_}.png"), *c["extra"])
            got = load_file(out)
            compare(f"{c['name']} tp {np_} latents", got["latents"], lat.float().numpy())
            compare(f"{c['name']} tp {np_} image", got["image"], np.asarray(img))


def components(tprun, mpi, tmp):
    """`tprun forward --component ...` on the shared/ref component cases, and
    `tprun verify --component text_encoder_2` at tp 2."""
    data = os.path.join(HERE, "..", "data")
    cases = [
        ("text_encoder", os.path.join(data, "clip_text", "text_encoder"), os.path.join(data, "clip_text"), 1),
        ("text_encoder_2", os.path.join(data, "t5_encoder", "text_encoder_2"), os.path.join(data, "t5_encoder"), 2),
        ("vae_decoder", os.path.join(data, "vae_decoder", "model"), os.path.join(data, "vae_decoder"), 1),
        ("vae_encoder", os.path.join(data, "vae_decoder", "model"), os.path.join(data, "vae_encoder"), 1),
    ]
    for comp, model, case, np_ in cases:
        out = os.path.join(tmp, comp + ".safetensors")
        mpirun(mpi, np_, tprun, "forward", "--component", comp, "--model", model, "--inputs",
               os.path.join(case, "inputs.safetensors"), "--out", out, "--tp", str(np_))
        got, want = load_file(out), load_file(os.path.join(case, "expected.safetensors"))
        for name in want:
            compare(f"forward {comp} {name}", got[name], want[name], 1e-4)
    text = mpirun(mpi, 2, tprun, "verify", "--component", "text_encoder_2", "--model",
                  os.path.join(data, "t5_encoder", "text_encoder_2"), "--tp", "2")
    print("\n".join(l for l in text.splitlines() if "all_reduce" in l or "OK" in l or "FAIL" in l))
    if "all_reduce calls per forward: 4 (plan: 4)" not in text:
        raise SystemExit("FAIL: verify did not count the planned AllReduces")


def schnell(tprun, mpi, tmp):
    """A FLUX.1-schnell-style folder (no guidance embedding, static shift 1.0
    from its scheduler_config.json): an init-model folder rewritten the way
    schnell differs from dev, then diffusers vs `tprun generate` at tp 1 and 2."""
    import torch
    from diffusers import FluxPipeline
    from safetensors.torch import load_file as load_pt, save_file as save_pt

    torch.set_num_threads(1)
    folder = os.path.join(tmp, "schnell")
    run([tprun, "init-model", folder, "--arch", "flux", "--preset", "tiny", "--seed", "3"])
    cfg_path = os.path.join(folder, "transformer", "config.json")
    cfg = json.load(open(cfg_path))
    cfg["guidance_embeds"] = False
    json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)
    w_path = os.path.join(folder, "transformer", "diffusion_pytorch_model.safetensors")
    w = {k: v for k, v in load_pt(w_path).items() if "guidance_embedder" not in k}
    save_pt(w, w_path, metadata={"format": "pt"})
    s_path = os.path.join(folder, "scheduler", "scheduler_config.json")
    sc = json.load(open(s_path))
    sc.update(shift=1.0, use_dynamic_shifting=False)
    json.dump(sc, open(s_path, "w"), indent=2, sort_keys=True)
    pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    assert not pipe.transformer.config.guidance_embeds
    prompt, seed = "a windmill in a tulip field", 21
    common = dict(prompt=prompt, height=64, width=64, num_inference_steps=2, guidance_scale=0.0,
                  max_sequence_length=64)
    lat = pipe(**common, generator=torch.Generator("cpu").manual_seed(seed), output_type="latent").images
    img = pipe(**common, generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images
    for np_ in (1, 2):
        out = os.path.join(tmp, f"schnell_tp{np_}.safetensors")
        mpirun(mpi, np_, tprun, "generate", "--model", folder, "--prompt", prompt, "--height", "64", "--width", "64",
               "--steps", "2", "--seed", str(seed), "--max-sequence-length", "64", "--out-tensors", out)
        got = load_file(out)
        compare(f"schnell tp {np_} latents", got["latents"], lat.float().numpy())
        compare(f"schnell tp {np_} image", got["image"], np.asarray(img))


def main():
    tprun, mpi, case = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        {"reference": reference, "init_model": init_model, "components": components, "schnell": schnell}[case](tprun, mpi, tmp)
    print("OK", case)


if __name__ == "__main__":
    main()
