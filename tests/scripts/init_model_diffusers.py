#!/usr/bin/env python3
"""`tprun init-model` against the real diffusers / transformers.

Usage: init_model_diffusers.py TPRUN [--preset tiny|small] [--dir DIR] [--keep]

1. `tprun init-model DIR --arch flux --preset P` (DIR: a temporary folder unless --dir).
2. diffusers' FluxPipeline.from_pretrained(DIR) loads it unchanged; each model
   component also loads on its own with no missing, unexpected or mismatched keys.
3. pipe.tokenizer / pipe.tokenizer_2 give, for a set of prompts, exactly the ids
   that tprun's C++ tokenizers give (`tprun tokenize --json`), called as
   FluxPipeline calls them (padding to max_length, truncation).
4. A 64x64 image generates (2 steps, one thread) and the time is printed.

Prints one line per check; exits 1 on the first mismatch. Run it with the venv's
python (~/.cache/tprun/venv/bin/python).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PROMPTS = [
    "A photo of a cat sitting on a windowsill, soft morning light.",
    "a red fox running through fresh snow",
    "Portrait of an old fisherman with a grey beard, dramatic lighting, 85mm lens.",
    "An astronaut riding a horse on the moon, digital art, 8k",
    "Don't stop: it's 2 AM (we'll see) -- 100% sure!",
    "QUICK BROWN FOX jumps over the lazy dog; price $19.99 + tax",
    "  leading and trailing spaces  ",
    "inner   whitespace\tand\nnewlines",
    "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e",
    "x[i] = {a * b} <tag> snake_case | path\\dir ^ `tick` ~ @ #",
    "unseen words: zygomorphic quixotic xylophone juxtaposition",
    "a very long prompt " + "with many repeated words " * 40,
    "<extra_id_0> sentinel and </s> eos literal",
    "",
]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def tprun_ids(tprun, model, prompt, max_len):
    out = subprocess.run(
        [tprun, "tokenize", "--model", model, "--prompt", prompt, "--json",
         "--max-sequence-length", str(max_len)],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tprun")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--dir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--max-sequence-length", type=int, default=512)
    args = ap.parse_args()

    import torch
    torch.set_num_threads(1)
    from diffusers import FluxPipeline, FluxTransformer2DModel, AutoencoderKL
    from transformers import CLIPTextModel, T5EncoderModel

    work = None
    if args.dir:
        model = args.dir
    else:
        work = tempfile.mkdtemp(prefix="tprun-init-model-")
        model = os.path.join(work, f"flux-{args.preset}")
    try:
        if not os.path.exists(os.path.join(model, "model_index.json")):
            subprocess.run([args.tprun, "init-model", model, "--arch", "flux", "--preset", args.preset],
                           check=True)
        pipe = FluxPipeline.from_pretrained(model, dtype=torch.float32)
        print(f"ok: FluxPipeline.from_pretrained: {type(pipe.tokenizer).__name__}, "
              f"{type(pipe.tokenizer_2).__name__}, {type(pipe.text_encoder).__name__}, "
              f"{type(pipe.text_encoder_2).__name__}, {type(pipe.transformer).__name__}, "
              f"{type(pipe.vae).__name__}, {type(pipe.scheduler).__name__}")

        for cls, sub in [(FluxTransformer2DModel, "transformer"), (AutoencoderKL, "vae"),
                         (CLIPTextModel, "text_encoder"), (T5EncoderModel, "text_encoder_2")]:
            _, info = cls.from_pretrained(model, subfolder=sub, output_loading_info=True)
            bad = {k: v for k, v in info.items() if v}
            if bad:
                fail(f"{sub}: loading info {bad}")
            print(f"ok: {sub} loads with no missing/unexpected/mismatched keys")

        clip_vocab = pipe.text_encoder.config.vocab_size
        t5_rows = pipe.text_encoder_2.config.vocab_size
        if len(pipe.tokenizer) != clip_vocab:
            fail(f"CLIP tokenizer length {len(pipe.tokenizer)} != text_encoder vocab_size {clip_vocab}")
        if len(pipe.tokenizer_2) > t5_rows:
            fail(f"T5 tokenizer length {len(pipe.tokenizer_2)} > text_encoder_2 vocab_size {t5_rows}")

        n = args.max_sequence_length
        for prompt in PROMPTS:
            want = tprun_ids(args.tprun, model, prompt, n)
            clip = pipe.tokenizer(prompt, padding="max_length", max_length=pipe.tokenizer.model_max_length,
                                  truncation=True).input_ids
            t5 = pipe.tokenizer_2(prompt, padding="max_length", max_length=n, truncation=True,
                                  add_special_tokens=True).input_ids
            if clip != want["tokenizer"]:
                fail(f"CLIP ids differ for {prompt!r}:\n  transformers {clip[:24]}\n  tprun        "
                     f"{want['tokenizer'][:24]}")
            if t5 != want["tokenizer_2"]:
                fail(f"T5 ids differ for {prompt!r}:\n  transformers {t5[:24]}\n  tprun        "
                     f"{want['tokenizer_2'][:24]}")
        print(f"ok: {len(PROMPTS)} prompts: both tokenizers' ids equal tprun's")

        gen = torch.Generator().manual_seed(0)
        pipe(PROMPTS[0], height=64, width=64, num_inference_steps=1, generator=gen, output_type="np",
             max_sequence_length=n)  # warm-up
        t0 = time.perf_counter()
        image = pipe(PROMPTS[0], height=64, width=64, num_inference_steps=2, guidance_scale=3.5,
                     generator=torch.Generator().manual_seed(0), output_type="np",
                     max_sequence_length=n).images[0]
        dt = time.perf_counter() - t0
        if image.shape != (64, 64, 3) or not (image >= 0).all() or not (image <= 1).all():
            fail(f"image has shape {image.shape} / range [{image.min()}, {image.max()}]")
        print(f"ok: 64x64 image, 2 steps, 1 thread: {dt:.3f} s (std {image.std():.3f})")
    finally:
        if work and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
