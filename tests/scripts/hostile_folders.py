#!/usr/bin/env python3
"""Hostile pipeline folders and messages.

Cases (one ctest entry each; `hostile_folders.py TPRUN MPIRUN CASE`):
  component_class_model_index  model_index.json naming "EvilModel", "../../etc" (as a class and as a
               component name), an unknown extra component, and a FLUX.1 transformer in a
               Flux2KleinPipeline (and EvilModel in a FluxPipeline): one checkpoint error (exit 4) naming
               model_index.json and the component, on every rank, before any weight is read.
  component_class_config  transformer/config.json _class_name "EvilModel" and 5, vae/config.json
               _class_name 5, a FLUX.1 transformer folder under a Flux2KleinPipeline: exit 4 naming
               the config file and _class_name ("is not a string (found 5)"), no weight read; `tprun
               forward --component transformer` on _class_name 5 says so too.
  vae_tiles    [memory] vae_tiling with tiles that cannot step (8 px at the VAE's scale factor 8):
               exit 3 before the model loads, naming vae_tile_sample_size in px; `tprun run` leaves
               no output folder behind. A tile that is not a multiple of the scale factor likewise.
  template_in_dev  a Qwen3 chat template in a FLUX.2 [dev] tokenizer folder: a folder error at load
               (exit 4, before any weight), not a request error; for `generate`, `run` and `tokenize`.
  truncation_warning  a prompt longer than max_sequence_length: one warning naming the request id and
               the number of tokens cut (diffusers' "The following part of your input was truncated
               because `max_sequence_length` is set to N tokens"), once per request under tp 2; FLUX.1's
               T5 path too; no warning for a prompt that fits.
  defaults_nul  a NUL in the manifest's [defaults] negative_prompt: exit 3 naming file:line and
               defaults.negative_prompt before the model loads (also through --set).
  utf8_offset  invalid UTF-8 in a FLUX.2 prompt: the error gives the byte offset in the user's
               prompt, not in the chat-templated text (generate and tokenize, klein and dev).
  pixtral_tokenizer_class  a FLUX.2 [dev] tokenizer folder whose tokenizer_config.json names
               LlamaTokenizerFast (as the hub's Mistral-Small-3.1 files do), PreTrainedTokenizerFast or
               TokenizersBackend: loaded, with the ids of diffusers' PixtralProcessor call.
  component_class_every_pipeline  for each registered pipeline (FluxPipeline, Flux2KleinPipeline,
               Flux2Pipeline, QwenImagePipeline): a wrong class in model_index.json, in a component's
               config.json _class_name and in the text encoder's architectures ([], a string, another
               class): exit 4 naming the file and the field, no weight read. QwenImagePipeline had no
               table: FluxTransformer2DModel, EvilModel, AutoencoderKLWan, T5EncoderModel, DDIMScheduler,
               and a Qwen3ForCausalLM text_encoder/ folder ran.
  index_class_name  model_index.json _class_name 5, "" or missing: exit 4 naming _class_name (was
               "class ''", exit 3), for generate, tokenize and inspect.
  pad_token_null  tokenizer_config.json pad_token null (Qwen-Image, klein): exit 4 at load naming
               pad_token (was exit 6 on every request); an unknown pad_token / eos_token: exit 4 naming the
               token and the key (was a bare vocabulary size mismatch).
  model_index_not_missing  a model_index.json that exists but cannot be stat'ed (a symlink loop) or
               is a folder: said as it is, never "no model_index.json".
  qwen_normalizer_null  a Qwen2Tokenizer tokenizer.json whose normalizer is null (or NFD): loaded,
               NFC applied as transformers 5's Qwen2Tokenizer does; `tprun tokenize` ids equal
               transformers' on decomposed / compatibility text.
  clip_transformers5  FLUX.1's text_encoder re-saved by transformers 5's CLIPTextModel.save_pretrained
               (names without "text_model."): `tprun forward --component text_encoder` equals
               transformers, and `tprun generate` equals diffusers' FluxPipeline image (1e-3).
"""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, run_cases  # noqa: E402

H = None
WEIGHTS_READ = "bytes on this rank"  # the pipeline's load line: a weight was read


def run(args, np_=1, timeout=300, env=None):
    """(exit code, log) like Harness.run, but the log decoded leniently (prompts with invalid UTF-8);
    np_ 0: tprun alone, without mpirun (file tools such as `tokenize`)."""
    cmd = [H.mpirun, "--oversubscribe", "-np", str(np_), H.tprun, *args, "--log-dir", ""] if np_ else [H.tprun, *args]
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "timed out (hang?)"
    return r.returncode, (r.stdout + r.stderr).decode("utf-8", "replace")


def generate_args(folder, out, prompt="a red fox", extra=()):
    return ["generate", "--model", folder, "--prompt", prompt, "--height", "64", "--width", "64", "--steps", "2",
            "--out", out, *extra]


def expect(label, args, code, wants, np_=2, absent=(WEIGHTS_READ,), timeout=300):
    """`args` ends with exit `code`, each of `wants` on (at least) np_ lines, none of `absent` in the log."""
    rc, log = run(args, np_=np_, timeout=timeout)
    counts = [sum(1 for line in log.splitlines() if w in line) for w in wants]
    missing = [a for a in absent if a in log]
    ok = rc == code and all(c >= max(np_, 1) for c in counts) and not missing
    H.check(ok, f"{label}: exit {rc} (want {code}), {list(zip(wants, counts))} of {max(np_, 1)} ranks"
            + (f", '{missing}' in the log" if missing else "") + ("" if ok else f"\n{log[-1500:]}"))
    return log


def edit_json(path, fn):
    with open(path) as f:
        data = json.load(f)
    fn(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def copy_model(work, src, name, edit=None):
    d = os.path.join(work, name)
    shutil.copytree(src, d)
    if edit:
        edit(d)
    return d


def index_edit(fn):
    return lambda d: edit_json(os.path.join(d, "model_index.json"), fn)


def write_manifest(work, name, model, body, requests=None):
    req = os.path.join(work, f"{name}.jsonl")
    with open(req, "w") as f:
        for line in requests or [{"id": "one", "prompt": "a red fox"}]:
            f.write(json.dumps(line) + "\n")
    path = os.path.join(work, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f'model = "{model}"\ndtype = "fp32"\nrequests = "{req}"\n\n[parallel]\ntp = 2\ndp = 1\n\n'
                f'[defaults]\nheight = 64\nwidth = 64\nsteps = 2\n\n{body}\n[output]\n'
                f'dir = "{os.path.join(work, name + "-out")}"\nformats = ["png"]\n')
    return path, os.path.join(work, name + "-out")


# ---- component classes ----------------------------------------------------------------------

def case_component_class_model_index(work):
    klein = H.init_model(work, "flux2-klein")
    flux = H.init_model(work, "flux")
    out = os.path.join(work, "never.png")

    def set_class(comp, lib, cls):
        return index_edit(lambda j: j.__setitem__(comp, [lib, cls]))

    d = copy_model(work, klein, "evil-transformer", set_class("transformer", "diffusers", "EvilModel"))
    expect("klein transformer EvilModel", generate_args(d, out), 4, ["model_index.json", '"EvilModel"]'])
    d = copy_model(work, klein, "evil-path-class", set_class("vae", "diffusers", "../../etc"))
    expect("klein vae class ../../etc", generate_args(d, out), 4, ["model_index.json", "'../../etc'"])
    # A component whose name walks out of the folder to a directory that exists.
    os.makedirs(os.path.join(work, "nest"))
    d = copy_model(work, klein, os.path.join("nest", "evil-path-name"),
                   index_edit(lambda j: j.__setitem__("../../etc", ["diffusers", "AutoencoderKL"])))
    os.makedirs(os.path.join(work, "etc"), exist_ok=True)
    expect("component named ../../etc", generate_args(d, out), 4, ["'../../etc' is not a plain folder name"])

    def extra(d):
        os.makedirs(os.path.join(d, "evil"))
        edit_json(os.path.join(d, "model_index.json"), lambda j: j.__setitem__("evil", ["diffusers", "EvilModel"]))
    d = copy_model(work, klein, "evil-extra", extra)
    expect("unknown extra component", generate_args(d, out), 4, ["component 'evil' (EvilModel) is not one"])
    d = copy_model(work, klein, "flux1-in-klein", set_class("transformer", "diffusers", "FluxTransformer2DModel"))
    expect("FLUX.1 transformer class in a Flux2KleinPipeline", generate_args(d, out), 4,
           ["model_index.json: transformer is [\"diffusers\", \"FluxTransformer2DModel\"]", "Flux2KleinPipeline"])
    d = copy_model(work, klein, "klein-vae-flux1", set_class("vae", "diffusers", "AutoencoderKL"))
    expect("AutoencoderKL named in a Flux2KleinPipeline", generate_args(d, out), 4, ["\"AutoencoderKL\"]"])
    d = copy_model(work, flux, "flux-evil", set_class("transformer", "diffusers", "EvilModel"))
    expect("FluxPipeline transformer EvilModel", generate_args(d, out), 4, ["model_index.json", '"EvilModel"]'])
    d = copy_model(work, flux, "flux-evil-tokenizer", set_class("tokenizer_2", "transformers", "EvilTokenizer"))
    expect("FluxPipeline tokenizer_2 EvilTokenizer", generate_args(d, out), 4, ["tokenizer_2", "EvilTokenizer"])
    # `tprun tokenize` reads the folder the same way.
    d = os.path.join(work, "evil-transformer")
    expect("tokenize on EvilModel", ["tokenize", "--model", d, "--prompt", "x"], 4, ['"EvilModel"]'], np_=0)
    H.check(not os.path.exists(out), "no image was written")


def case_component_class_config(work):
    klein = H.init_model(work, "flux2-klein")
    flux = H.init_model(work, "flux")
    out = os.path.join(work, "never.png")

    def config_class(comp, value):
        return lambda d: edit_json(os.path.join(d, comp, "config.json"), lambda j: j.__setitem__("_class_name", value))

    d = copy_model(work, klein, "evil-config", config_class("transformer", "EvilModel"))
    expect("transformer/config.json EvilModel", generate_args(d, out), 4,
           [os.path.join("transformer", "config.json") + ": _class_name 'EvilModel'"])
    d5 = copy_model(work, klein, "five-config", config_class("transformer", 5))
    expect("transformer/config.json _class_name 5", generate_args(d5, out), 4,
           [os.path.join("transformer", "config.json") + ": _class_name is not a string (found 5)"])
    d = copy_model(work, klein, "five-vae", config_class("vae", 5))
    expect("vae/config.json _class_name 5", generate_args(d, out), 4,
           [os.path.join("vae", "config.json") + ": _class_name is not a string (found 5)"])

    def flux1_transformer(d):
        shutil.rmtree(os.path.join(d, "transformer"))
        shutil.copytree(os.path.join(flux, "transformer"), os.path.join(d, "transformer"))
    d = copy_model(work, klein, "flux1-folder-in-klein", flux1_transformer)
    expect("FLUX.1 transformer folder in a Flux2KleinPipeline", generate_args(d, out), 4,
           ["_class_name 'FluxTransformer2DModel' is not a class a Flux2KleinPipeline accepts"])
    d = copy_model(work, flux, "flux-evil-config", config_class("transformer", "EvilModel"))
    expect("FluxPipeline transformer/config.json EvilModel", generate_args(d, out), 4, ["_class_name 'EvilModel'"])
    # The component alone: forward names the non-string class too.
    import torch
    from safetensors.torch import save_file
    inputs = os.path.join(work, "inputs.safetensors")
    save_file({"hidden_states": torch.zeros(1)}, inputs)
    rc, log = run(["forward", "--model", d5, "--component", "transformer", "--inputs", inputs,
                   "--out", os.path.join(work, "out.safetensors")])
    H.check(rc in (3, 4) and "_class_name is not a string (found 5)" in log and "''" not in log,
            f"forward on _class_name 5: exit {rc}, says it is not a string" + ("" if rc in (3, 4) else log[-800:]))


# ---- VAE tiles ------------------------------------------------------------------------------

def case_vae_tiles(work):
    klein = H.init_model(work, "flux2-klein")
    vae = json.load(open(os.path.join(klein, "vae", "config.json")))
    sf = 2 ** (len(vae["block_out_channels"]) - 1)
    H.check(sf == 8, f"the init-model VAE's scale factor is {sf} (the case assumes 8)")
    out = os.path.join(work, "never.png")
    # 8 px tiles: one latent pixel per tile, whose stride int(1 x 0.75) is 0 latent pixels.
    expect("generate with 8 px tiles", generate_args(klein, out, extra=("--memory", "vae_tiling=true", "--memory",
                                                                         "vae_tile_sample_size=8")),
           3, ["vae_tile_sample_size = 8 px", "at least 16 px"])
    expect("generate with 12 px tiles", generate_args(klein, out, extra=("--memory", "vae_tiling=true", "--memory",
                                                                          "vae_tile_sample_size=12")),
           3, ["vae_tile_sample_size = 12 px is not a multiple of the VAE's scale factor, 8 px"])
    expect("16 px tiles with overlap 0.75", generate_args(klein, out, extra=(
        "--memory", "vae_tiling=true", "--memory", "vae_tile_sample_size=16", "--memory", "vae_tile_overlap=0.75")),
        3, ["vae_tile_sample_size = 16 px with vae_tile_overlap = 0.75", "at least 32 px"])
    H.check(not os.path.exists(out), "no image was written")
    manifest, outdir = write_manifest(work, "tiles", klein, "[memory]\nvae_tiling = true\nvae_tile_sample_size = 8\n")
    expect("run with 8 px tiles", ["run", manifest], 3, ["vae_tile_sample_size = 8 px"])
    H.check(not os.path.exists(outdir), f"run left no output folder ({outdir})")
    # A tile that works (16 px, overlap 0.25) still runs and tiles.
    rc, log = run(generate_args(klein, os.path.join(work, "ok.png"), extra=(
        "--memory", "vae_tiling=true", "--memory", "vae_tile_sample_size=16")), np_=1)
    H.check(rc == 0, f"16 px tiles run: exit {rc}" + ("" if rc == 0 else log[-1500:]))


# ---- tokenizer folders, prompts and manifest text -------------------------------------------

def qwen3_template(klein):
    tok = os.path.join(klein, "tokenizer")
    jinja = os.path.join(tok, "chat_template.jinja")
    if os.path.exists(jinja):
        return open(jinja).read()
    return json.load(open(os.path.join(tok, "tokenizer_config.json")))["chat_template"]


def case_template_in_dev(work):
    klein = H.init_model(work, "flux2-klein")
    dev = H.init_model(work, "flux2-dev")
    template = qwen3_template(klein)

    def put_qwen3(d):
        tok = os.path.join(d, "tokenizer")
        for name in ("processor_config.json", "chat_template.json", "chat_template.jinja"):
            p = os.path.join(tok, name)
            if name == "processor_config.json" and os.path.exists(p):
                edit_json(p, lambda j: j.pop("chat_template", None))
            elif name != "processor_config.json" and os.path.exists(p):
                os.remove(p)
        with open(os.path.join(tok, "chat_template.json"), "w") as f:
            json.dump({"chat_template": template}, f)
    d = copy_model(work, dev, "dev-qwen3", put_qwen3)
    out = os.path.join(work, "never.png")
    expect("generate: Qwen3 template in a dev folder", generate_args(d, out), 4,
           ["the chat template is qwen3's; a Flux2Pipeline renders its prompts with the mistral3 template"])
    manifest, outdir = write_manifest(work, "dev", d, "")
    expect("run: Qwen3 template in a dev folder", ["run", manifest], 4, ["the chat template is qwen3's"])
    H.check(not os.path.exists(outdir), "run left no output folder")
    expect("tokenize: Qwen3 template in a dev folder", ["tokenize", "--model", d, "--prompt", "x"], 4,
           ["the chat template is qwen3's"], np_=0)


def case_truncation_warning(work):
    klein = H.init_model(work, "flux2-klein")
    long_prompt = " ".join(["a red fox in fresh snow, watercolor"] * 20)
    want = "truncated because `max_sequence_length` is set to 32 tokens"
    rc, log = run(generate_args(klein, os.path.join(work, "g.png"), prompt=long_prompt,
                                extra=("--max-sequence-length", "32")), np_=2)
    lines = [line for line in log.splitlines() if want in line]
    H.check(rc == 0 and len(lines) == 1 and "the prompt was truncated" in lines[0] and "tokens dropped" in lines[0],
            f"generate at tp 2: exit {rc}, {len(lines)} warning line(s) (want 1)\n" + "\n".join(lines[:3])
            + ("" if rc == 0 else log[-1500:]))
    manifest, outdir = write_manifest(
        work, "trunc", klein, "", requests=[{"id": "long-one", "prompt": long_prompt, "max_sequence_length": 32},
                                            {"id": "short-one", "prompt": "a fox", "max_sequence_length": 32},
                                            {"id": "long-two", "prompt": long_prompt + " again",
                                             "max_sequence_length": 32}])
    rc, log = run(["run", manifest], np_=2)
    per = {i: [line for line in log.splitlines() if want in line and f"request {i}:" in line]
           for i in ("long-one", "short-one", "long-two")}
    H.check(rc == 0 and len(per["long-one"]) == 1 and len(per["long-two"]) == 1 and not per["short-one"],
            f"run at tp 2: exit {rc}, warnings per request {[(k, len(v)) for k, v in per.items()]} (want 1, 0, 1)"
            + ("" if rc == 0 else log[-1500:]))
    flux = H.init_model(work, "flux")
    rc, log = run(generate_args(flux, os.path.join(work, "f.png"), prompt=long_prompt,
                                extra=("--max-sequence-length", "32")), np_=1)
    H.check(rc == 0 and sum(want in line for line in log.splitlines()) == 1,
            f"FluxPipeline T5 at 32: exit {rc}, warned once" + ("" if rc == 0 else log[-1500:]))
    rc, log = run(generate_args(klein, os.path.join(work, "s.png"), prompt="a fox"), np_=1)
    H.check(rc == 0 and "truncated" not in log, f"a prompt that fits: exit {rc}, no warning")


def case_defaults_nul(work):
    klein = H.init_model(work, "flux2-klein")
    manifest, outdir = write_manifest(work, "nul", klein, "")
    text = open(manifest).read().replace("[defaults]\n", '[defaults]\nnegative_prompt = "bad\\u0000text"\n')
    with open(manifest, "w") as f:
        f.write(text)
    expect("[defaults] negative_prompt with a NUL", ["run", manifest], 3,
           [f"{manifest}:", "defaults.negative_prompt", "NUL"])
    H.check(not os.path.exists(outdir), "run left no output folder")
    manifest2, outdir2 = write_manifest(work, "nul-set", klein, "")
    expect("--set defaults.negative_prompt with a NUL",
           ["run", manifest2, "--set", 'defaults.negative_prompt="x\\u0000y"'], 3, ["defaults.negative_prompt", "NUL"])
    H.check(not os.path.exists(outdir2), "run --set left no output folder")


# Byte 2 of "ab\xffcd" (not 2x / 2xx: before the fix the offset counted the chat template's text too).
AT_2 = re.compile(r"prompt: invalid UTF-8 byte 0xff at offset 2(?!\d)")


def case_utf8_offset(work):
    klein = H.init_model(work, "flux2-klein")
    dev = H.init_model(work, "flux2-dev")
    bad = os.fsencode("ab") + b"\xff" + os.fsencode("cd")
    for name, d in (("klein", klein), ("dev", dev)):
        args = [os.fsencode(a) for a in generate_args(d, os.path.join(work, f"{name}.png"))]
        i = args.index(b"a red fox")
        args[i] = bad
        rc, log = run(args, np_=1)
        H.check(rc == 6 and AT_2.search(log),
                f"{name} generate: exit {rc} (want 6), offset 2 in the prompt\n"
                + "\n".join(l for l in log.splitlines() if "UTF-8" in l)[:400])
        rc, log = run([b"tokenize", b"--model", os.fsencode(d), b"--prompt", bad], np_=0)
        H.check(rc != 0 and AT_2.search(log),
                f"{name} tokenize: exit {rc}, offset 2\n" + "\n".join(l for l in log.splitlines() if "UTF-8" in l)[:400])


# ---- real hub folders ------------------------------------------------------------------------

def case_pixtral_tokenizer_class(work):
    """FLUX.2 [dev]'s tokenizer folder with the tokenizer_class names the hub's processor files carry:
    `tprun tokenize` gives the ids diffusers' PixtralProcessor call gives (transformers loads its
    tokenizer as TokenizersBackend whatever the class says)."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from transformers import AutoProcessor
    dev = H.init_model(work, "flux2-dev")
    prompt = "a red fox in fresh snow, watercolor"
    for cls, extra in (("LlamaTokenizerFast", {"add_bos_token": True, "add_eos_token": False, "legacy": True}),
                       ("PreTrainedTokenizerFast", {}), ("TokenizersBackend", {})):
        d = copy_model(work, dev, f"dev-{cls}", lambda d: edit_json(
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


# ---- every pipeline's folder (issue 31) ------------------------------------------------------

PRESETS = (("flux", "FluxPipeline"), ("flux2-klein", "Flux2KleinPipeline"), ("flux2-dev", "Flux2Pipeline"),
           ("qwen-image", "QwenImagePipeline"))


def tokenize_args(folder):
    return ["tokenize", "--model", folder, "--prompt", "a red fox"]


def case_component_class_every_pipeline(work):
    out = os.path.join(work, "never.png")
    folders = {arch: H.init_model(work, arch) for arch, _ in PRESETS}
    for arch, cls in PRESETS:
        src = folders[arch]
        index = json.load(open(os.path.join(src, "model_index.json")))
        H.check(index["_class_name"] == cls, f"{arch} is a {cls}")
        # A wrong class in model_index.json, for every component it names.
        for comp, wrong in (("transformer", "EvilModel"), ("vae", "AutoencoderKLWan"),
                            ("text_encoder", "T5EncoderModel"), ("scheduler", "DDIMScheduler")):
            lib = index[comp][0]
            d = copy_model(work, src, f"{arch}-{comp}-{wrong}", index_edit(lambda j: j.__setitem__(comp, [lib, wrong])))
            expect(f"{cls} model_index.json {comp} {wrong} (tokenize)", tokenize_args(d), 4,
                   [f"model_index.json: {comp} is [\"{lib}\", \"{wrong}\"]"], np_=0)
        # The transformer class of another family.
        other = "FluxTransformer2DModel" if cls != "FluxPipeline" else "QwenImageTransformer2DModel"
        d = copy_model(work, src, f"{arch}-other-transformer",
                       index_edit(lambda j: j.__setitem__("transformer", ["diffusers", other])))
        expect(f"{cls} model_index.json transformer {other} (generate)", generate_args(d, out), 4,
               [f"model_index.json: transformer is [\"diffusers\", \"{other}\"]", cls])
        # The component's own config.json: _class_name, then architectures.
        for value, want in (("EvilModel", "_class_name 'EvilModel' is not a class"),
                            (5, "_class_name is not a string (found 5)"), ("", "_class_name '' is not a class")):
            d = copy_model(work, src, f"{arch}-config-{value}", lambda d: edit_json(
                os.path.join(d, "transformer", "config.json"), lambda j: j.__setitem__("_class_name", value)))
            expect(f"{cls} transformer/config.json _class_name {value!r}", tokenize_args(d), 4,
                   [os.path.join("transformer", "config.json") + ": " + want], np_=0)
        for value, want in ((["EvilModel"], "architectures[0] 'EvilModel' is not a class"),
                            ([], "architectures must be a list of class names (found [])"),
                            ("X", "architectures must be a list of class names (found \"X\")")):
            d = copy_model(work, src, f"{arch}-arch-{json.dumps(value)}", lambda d: edit_json(
                os.path.join(d, "text_encoder", "config.json"), lambda j: j.__setitem__("architectures", value)))
            expect(f"{cls} text_encoder/config.json architectures {value!r}", tokenize_args(d), 4,
                   [os.path.join("text_encoder", "config.json") + ": " + want], np_=0)
    # A Qwen-Image folder whose text_encoder/ is klein's Qwen3ForCausalLM ran to exit 0.
    def qwen3_encoder(d):
        shutil.rmtree(os.path.join(d, "text_encoder"))
        shutil.copytree(os.path.join(folders["flux2-klein"], "text_encoder"), os.path.join(d, "text_encoder"))
    d = copy_model(work, folders["qwen-image"], "qwen-with-qwen3", qwen3_encoder)
    expect("QwenImagePipeline with a Qwen3ForCausalLM text_encoder/", generate_args(d, out), 4,
           [os.path.join("text_encoder", "config.json") + ": architectures[0] 'Qwen3ForCausalLM' is not a class a "
            "QwenImagePipeline accepts"])
    H.check(not os.path.exists(out), "no image was written")


def case_index_class_name(work):
    klein = H.init_model(work, "flux2-klein")
    out = os.path.join(work, "never.png")
    for label, fn, want in (("5", lambda j: j.__setitem__("_class_name", 5), "_class_name is not a string (found 5)"),
                            ("empty", lambda j: j.__setitem__("_class_name", ""), "_class_name is empty"),
                            ("missing", lambda j: j.pop("_class_name"), "_class_name is missing")):
        d = copy_model(work, klein, f"class-{label}", index_edit(fn))
        line = "model_index.json: " + want
        expect(f"generate, _class_name {label}", generate_args(d, out), 4, [line])
        expect(f"tokenize, _class_name {label}", tokenize_args(d), 4, [line], np_=0)
        expect(f"inspect, _class_name {label}", ["inspect", d], 4, [line], np_=0)
    H.check(not os.path.exists(out), "no image was written")


def tokenizer_config_edit(fn):
    return lambda d: edit_json(os.path.join(d, "tokenizer", "tokenizer_config.json"), fn)


def case_pad_token_null(work):
    out = os.path.join(work, "never.png")
    for arch in ("qwen-image", "flux2-klein"):
        src = H.init_model(work, arch)
        d = copy_model(work, src, f"{arch}-pad-null", tokenizer_config_edit(lambda j: j.__setitem__("pad_token", None)))
        want = [os.path.join("tokenizer", "tokenizer_config.json") + ": pad_token is null or missing"]
        expect(f"{arch} pad_token null: generate", generate_args(d, out), 4, want)
        expect(f"{arch} pad_token null: tokenize", tokenize_args(d), 4, want, np_=0)
        manifest, outdir = write_manifest(work, f"{arch}-pad", d, "")
        expect(f"{arch} pad_token null: run", ["run", manifest], 4, want)
        H.check(not os.path.exists(os.path.join(outdir, "images")), f"{arch}: run wrote no image")
        for key in ("pad_token", "eos_token"):
            d = copy_model(work, src, f"{arch}-{key}-unknown",
                           tokenizer_config_edit(lambda j: j.__setitem__(key, "<|not_in_vocab|>")))
            expect(f"{arch} unknown {key}: generate", generate_args(d, out), 4,
                   ["'<|not_in_vocab|>' (id", f"tokenizer_config.json: {key} names a token"])
    H.check(not os.path.exists(out), "no image was written")


def case_model_index_not_missing(work):
    klein = H.init_model(work, "flux2-klein")
    loop = copy_model(work, klein, "loop")
    os.remove(os.path.join(loop, "model_index.json"))
    os.symlink("model_index.json", os.path.join(loop, "model_index.json"))
    for args in (tokenize_args(loop), ["inspect", loop]):
        rc, log = run(args, np_=0)
        H.check(rc not in (0, 3) and "no model_index.json" not in log and "symbolic links" in log,
                f"{args[0]} on a model_index.json symlink loop: exit {rc}, says what stat said\n{log[-600:]}")
    folder = copy_model(work, klein, "index-folder")
    os.remove(os.path.join(folder, "model_index.json"))
    os.makedirs(os.path.join(folder, "model_index.json"))
    expect("model_index.json a folder", tokenize_args(folder), 4, ["model_index.json is not a regular file"], np_=0)
    # The folder really without one still says so.
    none = os.path.join(work, "none")
    os.makedirs(none)
    rc, log = run(tokenize_args(none), np_=0)
    H.check(rc == 3 and "no model_index.json" in log, f"a folder without model_index.json: exit {rc}")


def qwen_tokenize_ids(folder, prompt):
    r = subprocess.run([H.tprun, "tokenize", "--model", folder, "--prompt", prompt, "--json"], capture_output=True,
                       text=True)
    return (json.loads(r.stdout)["tokenizer"] if r.returncode == 0 else r.stderr.strip()[-400:]), r.stderr


def case_qwen_normalizer_null(work):
    import transformers
    from qwen_image_tokenizer_parity import TEMPLATE
    src = H.init_model(work, "qwen-image")
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


def case_clip_transformers5(work):
    import numpy as np
    import torch
    from diffusers import FluxPipeline
    from safetensors import safe_open
    from safetensors.numpy import load_file
    from safetensors.torch import save_file
    from transformers import CLIPTextModel
    torch.set_num_threads(1)
    src = H.init_model(work, "flux")
    d = copy_model(work, src, "flux-clip5")
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
    pipe = FluxPipeline.from_pretrained(d, torch_dtype=torch.float32)
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
        H.check(diff <= 1e-3, f"image within 1e-3 of diffusers' FluxPipeline ({diff:.2e})")


CASES = {
    "pixtral_tokenizer_class": case_pixtral_tokenizer_class,
    "component_class_every_pipeline": case_component_class_every_pipeline,
    "index_class_name": case_index_class_name,
    "pad_token_null": case_pad_token_null,
    "model_index_not_missing": case_model_index_not_missing,
    "qwen_normalizer_null": case_qwen_normalizer_null,
    "clip_transformers5": case_clip_transformers5,
    "component_class_model_index": case_component_class_model_index,
    "component_class_config": case_component_class_config,
    "vae_tiles": case_vae_tiles,
    "template_in_dev": case_template_in_dev,
    "truncation_warning": case_truncation_warning,
    "defaults_nul": case_defaults_nul,
    "utf8_offset": case_utf8_offset,
}

if __name__ == "__main__":
    H = Harness(sys.argv[1], sys.argv[2])
    sys.exit(run_cases(H, CASES, "tprun-hostile-folders"))
