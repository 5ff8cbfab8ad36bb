"""What pipeline_parity.py needs to know of each registered pipeline class: one `Family` entry a class.

The harness (pipeline_parity.py) runs the same checks for every family; an entry says only what differs:
how the pipeline tokenizes (the ids `tprun tokenize --json` must give), which generate calls are compared
(folder variants, call arguments, tp sizes, flags) and within which tolerances, which refusals its folders
must give, its demo job, and the checks that exist for one family only. A field that is a string instead of a
spec says why the check does not apply to that family. A registered class without an entry fails
`parity_pipeline_registered`.
"""
import json
import os
import shutil
from dataclasses import dataclass, field

ROOT = os.environ.get("TPRUN_SRC", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DATA = os.path.join(ROOT, "tests", "data")


@dataclass
class Call:
    """One generate call, made through diffusers' pipeline and through `tprun generate` at each tp."""
    name: str
    prompt: str
    seed: int = 1
    steps: int = 3
    height: int = 64
    width: int = 64
    guidance: float = None      # --guidance / guidance_scale; None: neither is given
    negative: str = None        # --negative-prompt / negative_prompt, with true_cfg
    true_cfg: float = None      # --true-cfg-scale / true_cfg_scale
    max_sequence_length: int = None  # --max-sequence-length / max_sequence_length; None: diffusers' 512 for both
    diffusers_kw: dict = field(default_factory=dict)  # what only diffusers is given (schnell: guidance_scale 0)
    tps: tuple = (1, 2)
    extras: tuple = ((),)       # tprun flags, each run at each tp (Flux2Pipeline: the text encoder replicated)
    frames: int = None          # --frames / num_frames (a video pipeline); None: neither is given
    guidance_2: float = None    # --guidance-2 / guidance_scale_2 (Wan 2.2 A14B's second expert)


@dataclass
class Variant:
    """A folder `init-model` writes (with `seed`), edited by `edit(folder)` when given, and its calls."""
    name: str
    calls: list
    seed: int = 0
    edit: object = None
    check: object = None  # check(harness, pipe): what the edit must have made diffusers see
    arch: str = None      # init-model --arch of the folder when not the family's own (wan-a14b)


@dataclass
class Refusal:
    """`tprun generate` on a copy of the folder edited by `edit` (None: the folder itself) refused with exit
    `code` on every one of np_ ranks naming `want`, before any weight byte ("bytes on this rank" absent)."""
    label: str
    edit: object
    want: str
    code: int
    np_: int = 2
    extra: tuple = ()
    steps: int = 1


@dataclass
class Job:
    """A jobs/*.toml demo at dp 2 x tp 2 (np 4) on the preset's folder, once per `phases` value."""
    manifest: str
    requests: int
    phases: tuple = (None,)         # [schedule] phases set for each run; None: the manifest's
    sets: tuple = ()                # extra --set values
    cache_saved: bool = False       # the summary counts encodes the prompt cache saved (a prompt over seeds)
    alone: str = None               # a request id whose PNG must equal `tprun generate` of it alone at tp 2


@dataclass
class Batch:
    """Prompts of different token lengths: batched in one job they give each image `generate` gives alone, and
    diffusers' batched call gives the latents tprun gives alone."""
    prompts: tuple
    seeds: tuple
    steps: int = 3
    size: int = 64


@dataclass
class Family:
    cls: str
    # (prompts, max_sequence_length or None for tprun's default) each tokenized by `tprun tokenize --json`
    token_cases: list
    # expected_ids(pipe, prompt, max_sequence_length) -> {tokenize --json key: ids}, as the pipeline encodes
    expected_ids: object
    variants: list
    tolerance: dict            # {"latents": .., "image": .., "png": .. (levels of 255) or None}
    refusals: object            # [Refusal], or why none (str)
    job: object                # Job, or why not (str)
    batch: object              # Batch, or why not (str)
    long_prompt: object        # max_sequence_length past FLUX.1's 512 (int), or why not (str)
    vae_forward: object = True  # `tprun forward --component vae_decoder|vae_encoder` vs the diffusers VAE, or why not
    # tokenizer model_index key -> its text encoder's key, for "the tokenizer fits the embedding rows"
    vocab: dict = field(default_factory=dict)
    vocab_exact: tuple = ()    # tokenizers whose length is exactly the encoder's vocab_size
    allowed_missing: str = None  # substring of keys transformers may report missing (a part tprun never writes)
    folder_check: object = None  # folder_check(harness, folder): what only this family's folder has
    errors_extra: object = None  # errors_extra(harness, work, folder): non-refusal checks of the errors case
    extra_cases: dict = field(default_factory=dict)  # case name -> fn(harness, work): one family's own checks
    folder_call: dict = field(default_factory=dict)  # the folders case's diffusers call's extra arguments


PROMPT = "a red fox in fresh snow, watercolor"
NEGATIVE = "blurry, low quality"
# A short and a long prompt, batched (the short one's text padded, and masked where the family masks).
TWO_LENGTHS = Batch(("a cat", "a lighthouse on a cliff at dusk, oil painting, warm light, long shadows"), (5, 6))


# ---- FLUX.1 --------------------------------------------------------------------------------------------

# init_model_diffusers' prompts: both tokenizers, max_sequence_length 512.
FLUX_PROMPTS = [
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


def flux_ids(pipe, prompt, n):
    """FluxPipeline's two tokenizer calls: CLIP padded to its 77, T5 padded to max_sequence_length."""
    clip = pipe.tokenizer(prompt, padding="max_length", max_length=pipe.tokenizer.model_max_length,
                          truncation=True).input_ids
    t5 = pipe.tokenizer_2(prompt, padding="max_length", max_length=n, truncation=True,
                          add_special_tokens=True).input_ids
    return {"tokenizer": clip, "tokenizer_2": t5}


def flux_schnell(folder):
    """The init-model folder rewritten the way FLUX.1-schnell differs from dev: no guidance embedding, static
    shift 1.0 in its scheduler_config.json."""
    from safetensors.torch import load_file, save_file
    edit_json(os.path.join(folder, "transformer", "config.json"), lambda c: c.update(guidance_embeds=False))
    w_path = os.path.join(folder, "transformer", "diffusion_pytorch_model.safetensors")
    w = {k: v for k, v in load_file(w_path).items() if "guidance_embedder" not in k}
    save_file(w, w_path, metadata={"format": "pt"})
    edit_json(os.path.join(folder, "scheduler", "scheduler_config.json"),
              lambda c: c.update(shift=1.0, use_dynamic_shifting=False))


def flux_reference(h, work):
    """The committed tests/data/flux_pipeline case (diffusers' own output for given prompt embeddings and
    initial latents, 3 steps): `generate --inputs` at tp 1 and 2, latents and image within 1e-3, the PNG within
    one level of expected.png and its steps / guidance text chunks."""
    from PIL import Image
    from safetensors.numpy import load_file
    data = os.path.join(DATA, "flux_pipeline")
    want = load_file(os.path.join(data, "expected.safetensors"))
    expected_png = png_pixels(os.path.join(data, "expected.png"))
    for tp in (1, 2):
        out, png = os.path.join(work, f"ref_tp{tp}.safetensors"), os.path.join(work, f"ref_tp{tp}.png")
        rc, log = h.run(["generate", "--model", os.path.join(data, "model"), "--inputs",
                         os.path.join(data, "inputs.safetensors"), "--height", "32", "--width", "32", "--steps", "3",
                         "--guidance", "3.5", "--out-tensors", out, "--out", png], np_=tp)
        if not h.check(rc == 0, f"reference tp {tp} ran" + ("" if rc == 0 else f": {log[-1500:]}")):
            continue
        got = load_file(out)
        h.within(f"reference tp {tp} latents", got["latents"], want["latents"], 1e-3)
        h.within(f"reference tp {tp} image", got["image"], want["image"], 1e-3)
        h.within(f"reference tp {tp} png", png_pixels(png), expected_png, 1)
        info = Image.open(png).info
        h.check(info.get("steps") == "3" and info.get("guidance") == "3.5", f"reference tp {tp} PNG text {info}")


def flux_components(h, work):
    """`tprun forward --component ...` on the committed CLIP / T5 / VAE cases (1e-4; T5 at tp 2), and
    `tprun verify --component text_encoder_2 --tp 2` counting the planned AllReduces."""
    from safetensors.numpy import load_file
    for comp, model, case, tp in (("text_encoder", "clip_text/text_encoder", "clip_text", 1),
                                  ("text_encoder_2", "t5_encoder/text_encoder_2", "t5_encoder", 2),
                                  ("vae_decoder", "vae_decoder/model", "vae_decoder", 1),
                                  ("vae_encoder", "vae_decoder/model", "vae_encoder", 1)):
        out = os.path.join(work, comp + ".safetensors")
        rc, log = h.run(["forward", "--component", comp, "--model", os.path.join(DATA, model), "--inputs",
                         os.path.join(DATA, case, "inputs.safetensors"), "--out", out, "--tp", str(tp)], np_=tp)
        if not h.check(rc == 0, f"forward {comp} ran" + ("" if rc == 0 else f": {log[-1500:]}")):
            continue
        got, want = load_file(out), load_file(os.path.join(DATA, case, "expected.safetensors"))
        for name in want:
            h.within(f"forward {comp} {name}", got[name], want[name], 1e-4)
    rc, log = h.run(["verify", "--component", "text_encoder_2", "--model",
                     os.path.join(DATA, "t5_encoder", "text_encoder_2"), "--tp", "2"], np_=2)
    h.check(rc == 0 and "all_reduce calls per forward: 4 (plan: 4)" in log,
            f"verify text_encoder_2 --tp 2 counted the planned AllReduces (exit {rc})" + ("" if rc == 0 else log[-800:]))


# ---- FLUX.2 ---------------------------------------------------------------------------------------------

def klein_ids(pipe, prompt, n):
    """Flux2KleinPipeline: the Qwen3 chat template without thinking, padded to max_sequence_length."""
    tok = pipe.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    return {"tokenizer": [int(i) for i in tok(text, padding="max_length", truncation=True, max_length=n)["input_ids"]]}


def dev_ids(pipe, prompt, n):
    """Flux2Pipeline: PixtralProcessor's chat template over format_input, padded to max_sequence_length."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    ids = pipe.tokenizer.apply_chat_template(format_input([prompt]), add_generation_prompt=False, tokenize=True,
                                             return_dict=True, padding="max_length", truncation=True,
                                             max_length=n)["input_ids"][0]
    return {"tokenizer": [int(i) for i in ids]}


def klein_errors(h, work, folder):
    """Without tokenizer.json the folder's vocab.json + merges.txt give the same ids (as transformers builds
    Qwen2TokenizerFast from them); without those too, a refusal naming tokenizer.json."""
    import subprocess

    def ids(d):
        r = subprocess.run([h.tprun, "tokenize", "--model", d, "--prompt", PROMPT, "--max-sequence-length", "64",
                            "--json"], capture_output=True, text=True)
        return json.loads(r.stdout)["tokenizer"] if r.returncode == 0 else r.stderr[-500:]
    missing = copy_folder(folder, os.path.join(work, "no-tokenizer-json"),
                          lambda d: os.remove(os.path.join(d, "tokenizer", "tokenizer.json")))
    want, got = ids(folder), ids(missing)
    h.check(isinstance(got, list) and got == want, "no tokenizer.json: vocab.json + merges.txt give the same ids "
            f"({got if not isinstance(got, list) else len(got)})")
    os.remove(os.path.join(missing, "tokenizer", "vocab.json"))
    h.refused(Refusal("missing tokenizer.json and vocab.json", None, "tokenizer.json", 4), missing, work)


def rename_im_start(files):
    """An edit renaming <|im_start|> in the tokenizer folder's `files` (those that exist)."""
    def edit(d):
        for name in files:
            path = os.path.join(d, "tokenizer", name)
            if os.path.exists(path):
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace("<|im_start|>", "<|im_begin|>"))
    return edit


def klein_template_edit(d):
    """klein's chat template (chat_template.jinja or tokenizer_config.json) with <|im_start|> renamed."""
    if os.path.exists(os.path.join(d, "tokenizer", "chat_template.jinja")):
        rename_im_start(["chat_template.jinja"])(d)
    else:
        edit_json(os.path.join(d, "tokenizer", "tokenizer_config.json"),
                  lambda c: c.update(chat_template=c["chat_template"].replace("<|im_start|>", "<|im_begin|>")))


# ---- Qwen-Image -----------------------------------------------------------------------------------------

def qwen_ids(pipe, prompt, n):
    """QwenImagePipeline: its template, truncated at tokenizer_max_length + 34, never padded for one prompt."""
    assert n is None, "QwenImagePipeline's ids are compared at tprun's default max_sequence_length"
    ids = pipe.tokenizer([pipe.prompt_template_encode.format(prompt)], max_length=pipe.tokenizer_max_length + 34,
                         padding=True, truncation=True)["input_ids"][0]
    return {"tokenizer": [int(i) for i in ids]}


def qwen_folder(h, folder):
    h.check(not os.path.exists(os.path.join(folder, "tokenizer", "tokenizer.json")),
            "the tokenizer folder is the hub's slow layout (no tokenizer.json)")


def qwen_joint_dim(d):
    edit_json(os.path.join(d, "transformer", "config.json"),
              lambda c: c.update(joint_attention_dim=c["joint_attention_dim"] * 2))


# ---- helpers the entries use ----------------------------------------------------------------------------

def edit_json(path, fn):
    with open(path) as f:
        data = json.load(f)
    fn(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def copy_folder(src, dst, edit=None):
    shutil.copytree(src, dst)
    if edit:
        edit(dst)
    return dst


def png_pixels(path):
    import numpy as np
    from PIL import Image
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int32)


# ---- Wan -----------------------------------------------------------------------------------------------

# Text WanPipeline's prompt_clean rewrites (HTML entities unescaped twice, whitespace runs collapsed) and text
# outside the tiny tokenizer's vocabulary.
WAN_PROMPTS = [PROMPT, "caf\u00e9 &amp;amp; cr\u00e8me &lt;b&gt;bold&lt;/b&gt;", "  inner   whitespace\tand\nnewlines  ",
               "\u732b\u304c\u597d\u304d \U0001f98a", ""]


def wan_ids(pipe, prompt, n):
    """WanPipeline._get_t5_prompt_embeds: prompt_clean, padded to max_sequence_length (512), truncated."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean
    ids = pipe.tokenizer([prompt_clean(prompt)], padding="max_length", max_length=n or 512, truncation=True,
                         add_special_tokens=True, return_attention_mask=True)["input_ids"][0]
    return {"tokenizer": [int(i) for i in ids]}


def wan_boundary_without_transformer_2(d):
    """A Wan 2.1 folder (one transformer) whose model_index.json gains Wan 2.2's boundary_ratio."""
    edit_json(os.path.join(d, "model_index.json"), lambda j: j.update(boundary_ratio=0.875))

FAMILIES = {f.cls: f for f in [
    Family(
        cls="FluxPipeline",
        token_cases=[(FLUX_PROMPTS, 512), (["a red fox in the snow, watercolor", "Two cats; one sleeping. 42 lanterns!",
                                            ""], 64)],
        expected_ids=flux_ids,
        variants=[
            Variant("dev", [
                Call("distilled", "a red fox in the snow, watercolor", seed=7, steps=4, guidance=3.5,
                     max_sequence_length=64),
                Call("true_cfg", "a lighthouse at dusk", seed=11, steps=4, guidance=3.5, negative=NEGATIVE,
                     true_cfg=3.0, max_sequence_length=64)]),
            Variant("schnell", [Call("schnell", "a windmill in a tulip field", seed=21, steps=2, max_sequence_length=64,
                                     diffusers_kw={"guidance_scale": 0.0})],
                    seed=3, edit=flux_schnell,
                    check=lambda h, pipe: h.check(not pipe.transformer.config.guidance_embeds,
                                                  "schnell: diffusers reads guidance_embeds false")),
        ],
        tolerance={"latents": 1e-3, "image": 1e-3, "png": None},
        refusals="FLUX.1's folder refusals are hostile_folders.py's (component classes, tokenizers, truncation)",
        job="FLUX.1 jobs are run_job_cases.py's model (determinism at every dp x tp, resume, batches)",
        batch=TWO_LENGTHS,
        long_prompt="FluxPipeline's T5 stops at 512 tokens (the default is the limit)",
        vocab={"tokenizer": "text_encoder", "tokenizer_2": "text_encoder_2"},
        vocab_exact=("tokenizer",),
        extra_cases={"reference": flux_reference, "components": flux_components},
    ),
    Family(
        cls="Flux2KleinPipeline",
        token_cases=[([PROMPT], 96)],
        expected_ids=klein_ids,
        variants=[
            Variant("cfg", [Call("klein_cfg", PROMPT, guidance=4.0), Call("klein_nocfg", PROMPT, guidance=1.0)]),
            Variant("distilled", [Call("klein_distilled", PROMPT, guidance=4.0)],
                    edit=lambda d: edit_json(os.path.join(d, "model_index.json"), lambda j: j.update(is_distilled=True))),
        ],
        tolerance={"latents": 1e-3, "image": 1e-3, "png": None},
        refusals=[
            Refusal("unknown chat template", klein_template_edit, "is not one tprun knows", 4),
            Refusal("KV heads tp does not divide", None, "does not divide num_key_value_heads 2", 3, np_=4),
        ],
        errors_extra=klein_errors,
        job=Job(os.path.join(ROOT, "jobs", "flux2-klein-demo.toml"), 15,
                # batch_size 1: a batched image may differ from the unbatched one by float rounding, and this
                # check is about the cache (a hit must give the bytes a fresh encode gives).
                sets=("output.batch_size=1",), cache_saved=True, alone="fox-seed-2"),
        batch=TWO_LENGTHS,
        long_prompt="Flux2KleinPipeline's max_sequence_length is at most 512",
        vocab={"tokenizer": "text_encoder"},
    ),
    Family(
        cls="Flux2Pipeline",
        token_cases=[([PROMPT], 96)],
        expected_ids=dev_ids,
        variants=[Variant("dev", [Call("dev", PROMPT, guidance=4.0, extras=((), ("--replicate-text-encoders",)))])],
        tolerance={"latents": 1e-3, "image": 1e-3, "png": None},
        refusals="Flux2Pipeline's folder refusals are hostile_folders.py's (template_in_dev, pixtral_tokenizer_class)",
        job="the FLUX.2 job is Flux2KleinPipeline's (the same job runner and cache); dev's is staged_cases.py's",
        batch=TWO_LENGTHS,
        long_prompt="Flux2Pipeline's max_sequence_length is at most 512",
        vae_forward="the same AutoencoderKLFlux2 as Flux2KleinPipeline's (its components case)",
        vocab={"tokenizer": "text_encoder"},
    ),
    Family(
        cls="QwenImagePipeline",
        token_cases=[([PROMPT, " ".join([PROMPT] * 40)], None)],
        expected_ids=qwen_ids,
        variants=[Variant("nocfg", [Call(f"nocfg_{hh}x{ww}", PROMPT, height=hh, width=ww)
                                    for hh, ww in ((64, 64), (48, 80))]),
                  Variant("cfg", [Call(f"cfg_{hh}x{ww}", PROMPT, height=hh, width=ww, negative=NEGATIVE, true_cfg=4.0)
                                  for hh, ww in ((64, 64), (48, 80))])],
        tolerance={"latents": 1e-3, "image": 2e-3, "png": 2},
        refusals=[
            Refusal("a tokenizer without <|im_start|>", rename_im_start(
                ["tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"]), "<|im_start|>", 4,
                steps=2),  # two steps: the scheduler's shift_terminal refuses one
            Refusal("joint_attention_dim != the encoder's hidden size", qwen_joint_dim, "joint_attention_dim", 4,
                    steps=2),
            Refusal("max_sequence_length 1025", None,
                    "--max-sequence-length: 1025 is beyond QwenImagePipeline's limit of 1024", 3,
                    extra=("--max-sequence-length", "1025"), steps=2),
        ],
        job=Job(os.path.join(ROOT, "jobs", "qwen-image-demo.toml"), 8, phases=("together", "staged")),
        batch=TWO_LENGTHS,
        long_prompt=600,
        vae_forward="AutoencoderKLQwenImage's forward is qwen_image_vae_parity.py's (single-frame 5-D latents)",
        vocab={"tokenizer": "text_encoder"},
        allowed_missing="visual",  # the text encoder's vision tower: tprun never writes it, transformers draws it
        folder_check=qwen_folder,
    ),
    Family(
        cls="WanPipeline",
        token_cases=[(WAN_PROMPTS, None), ([PROMPT], 64)],
        expected_ids=wan_ids,
        variants=[
            Variant("t2v", [Call("nocfg", PROMPT, frames=5, guidance=1.0, height=48, width=64),
                            Call("cfg", PROMPT, seed=3, frames=9, guidance=5.0, negative=NEGATIVE)]),
            Variant("a14b", [Call("experts", PROMPT, seed=5, frames=5, steps=4, guidance=4.0, guidance_2=3.0,
                                  extras=((), ("--stage-experts",)))],
                    arch="wan-a14b"),
        ],
        # Frames: WanPipeline's float video (output_type "np"); MP4s are H.264's lossy frames, not compared.
        tolerance={"latents": 1e-3, "image": 2 / 255, "png": None},
        refusals=[
            Refusal("frames not 4k + 1", None, "frames", 3, extra=("--frames", "6")),
            Refusal("boundary_ratio without transformer_2", wan_boundary_without_transformer_2, "transformer_2", 4),
        ],
        job=Job(os.path.join(ROOT, "jobs", "wan-demo.toml"), 6),
        batch="WanPipeline's batches are the job case's (its prompts are padded to 512 tokens alike)",
        long_prompt="WanPipeline's max_sequence_length is at most 512",
        vae_forward="AutoencoderKLWan's forward is wan_vae_parity.py's (videos, tiling, the split decode)",
        vocab={"tokenizer": "text_encoder"},
        folder_call={"num_frames": 5},
    ),
]}
