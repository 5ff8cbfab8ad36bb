#!/usr/bin/env python3
"""Hostile pipeline folders and messages, for every pipeline class the binary registers.

The cases about a folder's components (classes in model_index.json and config.json, _class_name, a
model_index.json that is not a file, missing components, corrupt configs, truncated weights) are in
hostile_components.py, with what the cases share; this file has the rest and runs them all. Each case loops
over the registered classes (discovered from the binary: a new family is covered without an edit, and one
without an init-model preset fails); where a case does not apply to a family, the case says why (printed as
"n/a"), and every case must apply to at least one.

Cases (one ctest entry each; `hostile_folders.py TPRUN MPIRUN CASE`), besides hostile_components.py's:
  vae_tiles    [memory] vae_tiling with tiles that cannot step (8 px at the VAE's scale factor 8): exit 3 before
               the model loads, naming vae_tile_sample_size in px; `tprun run` leaves no output folder behind. A
               tile that is not a multiple of the scale factor likewise; 16 px tiles run.
  template_in_dev  another family's chat template in the tokenizer folder (a Qwen3 template in a FLUX.2 [dev]
               folder, Mistral's in klein): a folder error at load (exit 4, before any weight), not a request
               error; for `generate`, `run` and `tokenize`.
  truncation_warning  a prompt longer than max_sequence_length: one warning naming the request id and the number
               of tokens cut (diffusers' "The following part of your input was truncated because
               `max_sequence_length` is set to N tokens"), once per request under tp 2; no warning for a prompt
               that fits.
  defaults_nul  a NUL in the manifest's [defaults] negative_prompt: exit 3 naming file:line and
               defaults.negative_prompt before the model loads (also through --set).
  utf8_offset  invalid UTF-8 in a prompt: the error gives the byte offset in the user's prompt, not in the
               templated text (generate and tokenize).
  pixtral_tokenizer_class  a PixtralProcessor tokenizer folder whose tokenizer_config.json names
               LlamaTokenizerFast (as the hub's Mistral-Small-3.1 files do), PreTrainedTokenizerFast or
               TokenizersBackend: loaded, with the ids of diffusers' PixtralProcessor call.
  pad_token_null  tokenizer_config.json pad_token null: exit 4 at load naming pad_token (was exit 6 on every
               request); an unknown pad_token / eos_token: exit 4 naming the token and the key.
  qwen_normalizer_null  a Qwen2Tokenizer tokenizer.json whose normalizer is null (or NFD): loaded, NFC applied as
               transformers 5's Qwen2Tokenizer does; `tprun tokenize` ids equal transformers' on decomposed /
               compatibility text.
  clip_transformers5  a CLIPTextModel text_encoder re-saved by transformers 5's save_pretrained (names without
               "text_model."): `tprun forward --component text_encoder` equals transformers, and `tprun generate`
               equals the diffusers pipeline's image (1e-3).
"""
import functools
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_components  # noqa: E402
from hostile_components import (components, copy_model, edit_json, every_pipeline, expect, generate_args,  # noqa: E402
                                 run, tokenize_args)
from hostile_components import expect as expect_all  # noqa: E402
from tprun_harness import Harness, run_cases  # noqa: E402

H = None


def write_manifest(work, name, model, body, requests=None):
    req = os.path.join(work, f"{name}.jsonl")
    with open(req, "w") as f:
        for line in requests or [{"id": "one", "prompt": "a red fox"}]:
            f.write(json.dumps(line) + "\n")
    path = os.path.join(work, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f'model = "{model}"\ndtype = "fp32"\nrequests = "{req}"\n\n[parallel]\ntp = 2\ndp = 1\n\n'
                f'[defaults]\nheight = 64\nwidth = 64\nsteps = 2\nframes = 1\n\n{body}\n[output]\n'
                f'dir = "{os.path.join(work, name + "-out")}"\nformats = ["png"]\n')
    return path, os.path.join(work, name + "-out")


# ---- VAE tiles ------------------------------------------------------------------------------------------

def vae_scale_factor(folder):
    """The VAE's spatial scale factor from its config.json, as the diffusers pipelines compute it."""
    cfg = json.load(open(os.path.join(folder, "vae", "config.json")))
    if "temperal_downsample" in cfg:  # AutoencoderKLQwenImage (QwenImagePipeline: 2 ** len(temperal_downsample))
        return 2 ** len(cfg["temperal_downsample"])
    return 2 ** (len(cfg["block_out_channels"]) - 1)  # AutoencoderKL, AutoencoderKLFlux2


@every_pipeline()
def case_vae_tiles(work, cls, src, folders):
    """A refusal raised on one rank only leaves the others waiting: each refusal has 120 s."""
    expect = functools.partial(expect_all, timeout=120)
    sf = vae_scale_factor(src)
    if not H.check(sf == 8, f"{cls}: the init-model VAE's scale factor is {sf} (the case assumes 8)"):
        return
    out = os.path.join(work, "never.png")
    tiles = lambda *kv: [a for k in kv for a in ("--memory", k)]  # noqa: E731
    # 8 px tiles: one latent pixel per tile, whose stride int(1 x 0.75) is 0 latent pixels.
    expect(f"{cls} generate with 8 px tiles", generate_args(src, out, extra=tiles("vae_tiling=true",
                                                                                 "vae_tile_sample_size=8")),
           3, ["vae_tile_sample_size = 8 px", "at least 16 px"])
    expect(f"{cls} generate with 12 px tiles", generate_args(src, out, extra=tiles("vae_tiling=true",
                                                                                  "vae_tile_sample_size=12")),
           3, ["vae_tile_sample_size = 12 px is not a multiple of the VAE's scale factor, 8 px"])
    expect(f"{cls} 16 px tiles with overlap 0.75", generate_args(src, out, extra=tiles(
        "vae_tiling=true", "vae_tile_sample_size=16", "vae_tile_overlap=0.75")),
        3, ["vae_tile_sample_size = 16 px with vae_tile_overlap = 0.75", "at least 32 px"])
    H.check(not os.path.exists(out), "no image was written")
    manifest, outdir = write_manifest(work, f"{cls}-tiles", src,
                                      "[memory]\nvae_tiling = true\nvae_tile_sample_size = 8\n")
    expect(f"{cls} run with 8 px tiles", ["run", manifest], 3, ["vae_tile_sample_size = 8 px"])
    H.check(not os.path.exists(outdir), f"run left no output folder ({outdir})")
    # A tile that works (16 px, overlap 0.25) still runs and tiles.
    rc, log = run(generate_args(src, os.path.join(work, f"{cls}-ok.png"), extra=tiles(
        "vae_tiling=true", "vae_tile_sample_size=16")), np_=1)
    H.check(rc == 0, f"{cls} 16 px tiles run: exit {rc}" + ("" if rc == 0 else log[-1500:]))


# ---- tokenizer folders, prompts and manifest text -------------------------------------------------------

# Where a tokenizer folder may keep its chat template (hf_tokenizer.cpp: a processor reads processor_config.json,
# chat_template.json then chat_template.jinja; a tokenizer chat_template.jinja then tokenizer_config.json).
def chat_template(folder):
    tok = os.path.join(folder, "tokenizer")
    for name, key in (("chat_template.jinja", None), ("chat_template.json", "chat_template"),
                      ("processor_config.json", "chat_template"), ("tokenizer_config.json", "chat_template")):
        path = os.path.join(tok, name)
        if os.path.exists(path):
            value = open(path).read() if key is None else json.load(open(path)).get(key)
            if isinstance(value, str) and value:
                return value
    return None


def put_template(template):
    """An edit replacing every chat template of the tokenizer folder by `template` (in chat_template.jinja, which
    both a processor and a tokenizer read)."""
    def edit(d):
        tok = os.path.join(d, "tokenizer")
        for name in ("chat_template.json", "chat_template.jinja"):
            if os.path.exists(os.path.join(tok, name)):
                os.remove(os.path.join(tok, name))
        for name in ("processor_config.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(tok, name)):
                edit_json(os.path.join(tok, name), lambda j: j.pop("chat_template", None))
        with open(os.path.join(tok, "chat_template.jinja"), "w") as f:
            f.write(template)
    return edit


def no_chat_template(cls, folder):
    return None if chat_template(folder) else "its tokenizer folder has no chat template (the prompt is tokenized as is)"


@every_pipeline(why_not={"QwenImagePipeline": "QwenImagePipeline formats prompts with its own prompt_template_encode, "
                                              "never the folder's chat template (diffusers likewise); a tokenizer "
                                              "without <|im_start|> is pipeline_parity.py errors'"},
                applies=no_chat_template)
def case_template_in_dev(work, cls, src, folders):
    mine = chat_template(src)
    foreign = [(other, t) for other, f in folders.items() if other != cls and other != "QwenImagePipeline"
               for t in [chat_template(f)] if t and t != mine]
    H.check(bool(foreign), f"{cls}: another family's chat template to put in its folder ({[o for o, _ in foreign]})")
    out = os.path.join(work, "never.png")
    for other, template in foreign:
        d = copy_model(work, src, f"{cls}-template-of-{other}", put_template(template))
        want = f"a {cls} renders its prompts with the"
        expect(f"generate: {other}'s template in a {cls} folder", generate_args(d, out), 4,
               ["the chat template is ", want])
        manifest, outdir = write_manifest(work, f"{cls}-{other}", d, "")
        expect(f"run: {other}'s template in a {cls} folder", ["run", manifest], 4, ["the chat template is ", want])
        H.check(not os.path.exists(outdir), "run left no output folder")
        expect(f"tokenize: {other}'s template in a {cls} folder", tokenize_args(d), 4, ["the chat template is "],
               np_=0)


def tokens_used(folder, prompt):
    """The most text tokens of `prompt` that reach the transformer through any of the folder's tokenizers, as
    `tprun tokenize` counts them at max_sequence_length 512 ("..., 20 used, 20 before truncation")."""
    r = subprocess.run([H.tprun, "tokenize", "--model", folder, "--prompt", prompt, "--max-sequence-length", "512"],
                       capture_output=True, text=True)
    used = [int(n) for n in re.findall(r"(\d+) used, \d+ before truncation", r.stdout)]
    if r.returncode != 0 or not used:
        raise SystemExit(f"FAIL: tokenize on {folder}: exit {r.returncode}\n{r.stdout[-500:]}{r.stderr[-500:]}")
    return max(used)


@every_pipeline()
def case_truncation_warning(work, cls, src, folders):
    long_prompt = " ".join(["a red fox in fresh snow, watercolor"] * 20)
    # 32 tokens, or what "a fox" takes with the family's template (a system message: FLUX.2 [dev]'s 99 tokens).
    n = max(32, tokens_used(src, "a fox"))
    H.check(tokens_used(src, long_prompt) > n, f"{cls}: the long prompt is longer than {n} tokens, 'a fox' fits")
    want = f"truncated because `max_sequence_length` is set to {n} tokens"
    rc, log = run(generate_args(src, os.path.join(work, f"{cls}-g.png"), prompt=long_prompt,
                                extra=("--max-sequence-length", str(n))), np_=2)
    lines = [line for line in log.splitlines() if want in line]
    H.check(rc == 0 and len(lines) == 1 and "the prompt was truncated" in lines[0] and "tokens dropped" in lines[0],
            f"{cls} generate at tp 2: exit {rc}, {len(lines)} warning line(s) (want 1)\n" + "\n".join(lines[:3])
            + ("" if rc == 0 else log[-1500:]))
    manifest, outdir = write_manifest(
        work, f"{cls}-trunc", src, "", requests=[{"id": "long-one", "prompt": long_prompt, "max_sequence_length": n},
                                                 {"id": "short-one", "prompt": "a fox", "max_sequence_length": n},
                                                 {"id": "long-two", "prompt": long_prompt + " again",
                                                  "max_sequence_length": n}])
    rc, log = run(["run", manifest], np_=2)
    per = {i: [line for line in log.splitlines() if want in line and f"request {i}:" in line]
           for i in ("long-one", "short-one", "long-two")}
    H.check(rc == 0 and len(per["long-one"]) == 1 and len(per["long-two"]) == 1 and not per["short-one"],
            f"{cls} run at tp 2: exit {rc}, warnings per request {[(k, len(v)) for k, v in per.items()]} (want 1, 0, 1)"
            + ("" if rc == 0 else log[-1500:]))
    rc, log = run(generate_args(src, os.path.join(work, f"{cls}-s.png"), prompt="a fox"), np_=1)
    H.check(rc == 0 and "truncated" not in log, f"{cls} a prompt that fits: exit {rc}, no warning")


@every_pipeline()
def case_defaults_nul(work, cls, src, folders):
    manifest, outdir = write_manifest(work, f"{cls}-nul", src, "")
    text = open(manifest).read().replace("[defaults]\n", '[defaults]\nnegative_prompt = "bad\\u0000text"\n')
    with open(manifest, "w") as f:
        f.write(text)
    expect(f"{cls} [defaults] negative_prompt with a NUL", ["run", manifest], 3,
           [f"{manifest}:", "defaults.negative_prompt", "NUL"])
    H.check(not os.path.exists(outdir), "run left no output folder")
    manifest2, outdir2 = write_manifest(work, f"{cls}-nul-set", src, "")
    expect(f"{cls} --set defaults.negative_prompt with a NUL",
           ["run", manifest2, "--set", 'defaults.negative_prompt="x\\u0000y"'], 3, ["defaults.negative_prompt", "NUL"])
    H.check(not os.path.exists(outdir2), "run --set left no output folder")


# Byte 2 of "ab\xffcd" (not 2x / 2xx: before the fix the offset counted the chat template's text too).
AT_2 = re.compile(r"prompt: invalid UTF-8 byte 0xff at offset 2(?!\d)")


@every_pipeline()
def case_utf8_offset(work, cls, src, folders):
    bad = os.fsencode("ab") + b"\xff" + os.fsencode("cd")
    args = [os.fsencode(a) for a in generate_args(src, os.path.join(work, f"{cls}.png"))]
    args[args.index(b"a red fox")] = bad
    rc, log = run(args, np_=1)
    H.check(rc == 6 and AT_2.search(log), f"{cls} generate: exit {rc} (want 6), offset 2 in the prompt\n"
            + "\n".join(line for line in log.splitlines() if "UTF-8" in line)[:400])
    rc, log = run([b"tokenize", b"--model", os.fsencode(src), b"--prompt", bad], np_=0)
    H.check(rc != 0 and AT_2.search(log), f"{cls} tokenize: exit {rc}, offset 2\n"
            + "\n".join(line for line in log.splitlines() if "UTF-8" in line)[:400])


def tokenizer_config_edit(fn):
    return lambda d: edit_json(os.path.join(d, "tokenizer", "tokenizer_config.json"), fn)


@every_pipeline(why_not={"FluxPipeline": "FluxPipeline's CLIP and T5 tokenizers fall back to their own pad tokens "
                                         "(<|endoftext|>, <pad>) where tokenizer_config.json has none, and refuse "
                                         "an unknown one in their own words (clip_tokenizer.cpp, t5_tokenizer.cpp)"})
def case_pad_token_null(work, cls, src, folders):
    out = os.path.join(work, "never.png")
    d = copy_model(work, src, f"{cls}-pad-null", tokenizer_config_edit(lambda j: j.__setitem__("pad_token", None)))
    want = [os.path.join("tokenizer", "tokenizer_config.json") + ": pad_token is null or missing"]

    expect(f"{cls} pad_token null: generate", generate_args(d, out), 4, want)
    expect(f"{cls} pad_token null: tokenize", tokenize_args(d), 4, want, np_=0)
    manifest, outdir = write_manifest(work, f"{cls}-pad", d, "")
    expect(f"{cls} pad_token null: run", ["run", manifest], 4, want)
    H.check(not os.path.exists(os.path.join(outdir, "images")), f"{cls}: run wrote no image")
    for key in ("pad_token", "eos_token"):
        d = copy_model(work, src, f"{cls}-{key}-unknown",
                       tokenizer_config_edit(lambda j: j.__setitem__(key, "<|not_in_vocab|>")))
        # A tokenizer.json tokenizer (Wan's UMT5) names the token it does not have; the others the id
        # transformers would give it past the text encoder's vocabulary.
        wants = ([f"tokenizer_config.json: {key} names '<|not_in_vocab|>'"] if cls == "WanPipeline"
                 else ["'<|not_in_vocab|>' (id", f"tokenizer_config.json: {key} names a token"])
        expect(f"{cls} unknown {key}: generate", generate_args(d, out), 4, wants)
    H.check(not os.path.exists(out), "no image was written")


# ---- real hub folders ------------------------------------------------------------------------

def tokenizer_class_is(want):
    def applies(cls, folder):
        got = components(folder).get("tokenizer", [None, None])[1]
        return None if got and got.startswith(want) else f"its tokenizer is {got}, not a {want}"
    return applies


@every_pipeline(applies=tokenizer_class_is("PixtralProcessor"))
def case_pixtral_tokenizer_class(work, pipeline, dev, folders):
    """FLUX.2 [dev]'s (a PixtralProcessor's) tokenizer folder with the tokenizer_class names the hub's processor files carry:
    `tprun tokenize` gives the ids diffusers' PixtralProcessor call gives (transformers loads its
    tokenizer as TokenizersBackend whatever the class says)."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from transformers import AutoProcessor
    prompt = "a red fox in fresh snow, watercolor"
    for cls, extra in (("LlamaTokenizerFast", {"add_bos_token": True, "add_eos_token": False, "legacy": True}),
                       ("PreTrainedTokenizerFast", {}), ("TokenizersBackend", {})):
        d = copy_model(work, dev, f"{pipeline}-{cls}", lambda d: edit_json(
            os.path.join(d, "tokenizer", "tokenizer_config.json"), lambda j: j.update({"tokenizer_class": cls, **extra})))
        r = subprocess.run([H.tprun, "tokenize", "--model", d, "--prompt", prompt, "--max-sequence-length", "48",
                            "--json"], capture_output=True, text=True)
        got = json.loads(r.stdout)["tokenizer"] if r.returncode == 0 else r.stderr.strip()[-300:]
        try:
            proc = AutoProcessor.from_pretrained(os.path.join(d, "tokenizer"))
        except ImportError as e:  # PixtralProcessor needs torchvision
            H.check(r.returncode == 0, f"{cls}: tprun loads the folder (PixtralProcessor not checked here: {e})")
            continue
        want = proc.apply_chat_template(format_input([prompt]), add_generation_prompt=False, tokenize=True,
                                        return_dict=True, padding="max_length", truncation=True,
                                        max_length=48)["input_ids"][0]
        H.check(got == [int(i) for i in want], f"tokenizer_class {cls}: tprun tokenize ids equal "
                f"{type(proc).__name__}'s" + ("" if r.returncode == 0 else f": {got}"))


def qwen_tokenize_ids(folder, prompt):
    r = subprocess.run([H.tprun, "tokenize", "--model", folder, "--prompt", prompt, "--json"], capture_output=True,
                       text=True)
    return (json.loads(r.stdout)["tokenizer"] if r.returncode == 0 else r.stderr.strip()[-400:]), r.stderr


@every_pipeline(why_not={"Flux2KleinPipeline": "klein's Qwen2Tokenizer is the same class through the same reader; "
                                               "the ids here are QwenImagePipeline's template's"},
                applies=tokenizer_class_is("Qwen2Tokenizer"))
def case_qwen_normalizer_null(work, cls, src, folders):
    import transformers
    from qwen_image_tokenizer_parity import TEMPLATE
    # The fast layout (tokenizer.json), as transformers saves the folder's tokenizer.
    fast = copy_model(work, src, "qwen-fast")
    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(src, "tokenizer"))
    shutil.rmtree(os.path.join(fast, "tokenizer"))
    tok.save_pretrained(os.path.join(fast, "tokenizer"))
    tj = os.path.join(fast, "tokenizer", "tokenizer.json")
    H.check(json.load(open(tj))["normalizer"] == {"type": "NFC"}, "transformers saves normalizer NFC")
    prompts = ["a red fox", "cafe\u0301 se\u0301ance, Angstro\u0308m", "\ufb01ne \u212b \u1e9b\u0323"]
    for label, normalizer in (("null", None), ("NFD", {"type": "NFD"})):
        d = copy_model(work, fast, f"qwen-normalizer-{label}",
                       lambda d: edit_json(os.path.join(d, "tokenizer", "tokenizer.json"),
                                           lambda j: j.__setitem__("normalizer", normalizer)))
        ref = transformers.AutoTokenizer.from_pretrained(os.path.join(d, "tokenizer"))
        H.check(type(ref).__name__.startswith("Qwen2Tokenizer"), f"{label}: transformers loads {type(ref).__name__}")
        for p in prompts:
            want = ref([TEMPLATE.format(p)], max_length=1024 + 34, padding=True, truncation=True)["input_ids"][0]
            got, err = qwen_tokenize_ids(d, p)
            H.check(got == [int(i) for i in want], f"normalizer {label}, prompt {p!r}: tprun ids equal transformers'"
                    + ("" if isinstance(got, list) else f": {got}"))
        H.check(label == "null" or "is not used: a Qwen2Tokenizer applies NFC" in err, f"normalizer {label}: a warning names the unused normalizer")


def clip_text_encoder(cls, folder):
    comps = {k: v[1] for k, v in components(folder).items() if v[1] == "CLIPTextModel"}
    return None if "text_encoder" in comps else "it has no CLIPTextModel text_encoder"


@every_pipeline(applies=clip_text_encoder)
def case_clip_transformers5(work, cls, src, folders):
    import diffusers
    import numpy as np
    import torch
    from safetensors import safe_open
    from safetensors.numpy import load_file
    from safetensors.torch import save_file
    from transformers import CLIPTextModel
    torch.set_num_threads(1)
    d = copy_model(work, src, f"{cls}-clip5")
    enc = os.path.join(d, "text_encoder")
    hub = CLIPTextModel.from_pretrained(os.path.join(src, "text_encoder"), torch_dtype=torch.float32)
    # A model made in transformers 5 (not loaded from a prefixed file, whose names save_pretrained keeps).
    model = CLIPTextModel(hub.config)
    model.load_state_dict(hub.state_dict())
    model.eval()
    shutil.rmtree(enc)
    model.save_pretrained(enc)
    names = list(safe_open(os.path.join(enc, "model.safetensors"), "pt").keys())
    H.check(names and not any(n.startswith("text_model.") for n in names),
            f"transformers 5 saves CLIPTextModel without the text_model. prefix ({names[:2]})")
    # The encoder alone against transformers.
    ids = torch.tensor([[49406, 320, 1774, 3240, 49407] + [49407] * 11]) % model.config.vocab_size
    inputs = os.path.join(work, "clip-inputs.safetensors")
    save_file({"input_ids": ids}, inputs)
    out = os.path.join(work, "clip-out.safetensors")
    rc, log = run(["forward", "--model", enc, "--component", "text_encoder", "--inputs", inputs, "--out", out], np_=1)
    H.check(rc == 0, f"forward on the transformers 5 text_encoder: exit {rc}" + ("" if rc == 0 else log[-1500:]))
    if rc == 0:
        with torch.no_grad():
            ref = model(ids)
        got = load_file(out)
        for name, want in (("last_hidden_state", ref.last_hidden_state), ("pooler_output", ref.pooler_output)):
            diff = float(np.abs(got[name].astype(np.float64) - want.numpy().astype(np.float64)).max())
            H.check(diff <= 1e-4, f"forward {name} within 1e-4 of transformers ({diff:.2e})")
    # The whole pipeline against diffusers.
    pipe = getattr(diffusers, cls).from_pretrained(d, torch_dtype=torch.float32)
    prompt, seed = "a red fox in the snow, watercolor", 7
    img = pipe(prompt=prompt, height=64, width=64, num_inference_steps=2, guidance_scale=3.5, max_sequence_length=64,
               generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images
    tensors = os.path.join(work, "clip5.safetensors")
    rc, log = run(["generate", "--model", d, "--prompt", prompt, "--height", "64", "--width", "64", "--steps", "2",
                   "--guidance", "3.5", "--seed", str(seed), "--max-sequence-length", "64", "--out-tensors", tensors,
                   "--out", os.path.join(work, "clip5.png")], np_=1)
    H.check(rc == 0, f"generate on the transformers 5 text_encoder: exit {rc}" + ("" if rc == 0 else log[-1500:]))
    if rc == 0:
        diff = float(np.abs(load_file(tensors)["image"].astype(np.float64) - np.asarray(img, np.float64)).max())
        H.check(diff <= 1e-3, f"image within 1e-3 of diffusers' {cls} ({diff:.2e})")


CASES = dict(hostile_components.CASES, **{
    "vae_tiles": case_vae_tiles,
    "template_in_dev": case_template_in_dev,
    "truncation_warning": case_truncation_warning,
    "defaults_nul": case_defaults_nul,
    "utf8_offset": case_utf8_offset,
    "pixtral_tokenizer_class": case_pixtral_tokenizer_class,
    "pad_token_null": case_pad_token_null,
    "qwen_normalizer_null": case_qwen_normalizer_null,
    "clip_transformers5": case_clip_transformers5,
})

if __name__ == "__main__":
    H = hostile_components.H = Harness(sys.argv[1], sys.argv[2])
    sys.exit(run_cases(H, CASES, "tprun-hostile-folders"))
