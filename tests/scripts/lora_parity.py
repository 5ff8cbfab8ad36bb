#!/usr/bin/env python3
"""`tprun generate --lora` against diffusers' `load_lora_weights` + `set_adapters` (and `fuse_lora`), per family.

usage: lora_parity.py TPRUN MPIRUN CLASS [MODE]
MODE: ci (default), all (every pair at every tp with both --lora-apply values, and each format alone at tp 1),
refs (the diffusers side only: the adapters, the references and their own checks; no tprun generate).

For the family's `init-model` folder (the small preset where the tiny one's heads do not divide tp 4) the adapters
of each format diffusers reads for that class are written (lora_adapters.py: peft with metadata, with
rank_pattern / alpha_pattern, with rslora, prefixed keys, kohya / BFL / Wan original names, FLUX.1's CLIP keys),
each from its own seed with every B non-zero. Pairs of formats are stacked with weights: diffusers loads both
(`load_lora_weights(file, adapter_name=...)`, `set_adapters([a, b], adapter_weights=[w1, w2])`) and generates with a
fixed seed (the pipeline_parity.py way: CPU fp32, a CPU generator, output_type "np"); that reference is made once
per pair and reused for every tprun run. diffusers checks itself first: the pair moves the image well past the
tolerance (the adapter is no no-op), unloading gives the base image back, and `fuse_lora` gives the unfused image
within the tolerance. Then `tprun generate ... --lora A --lora-scale w1 --lora B --lora-scale w2 --lora-apply
fused|runtime` under mpirun at tp 1, 2 and 4: the float image (or video frames) and the PNG within the family's
tolerances. In ci mode each pair runs once at each tp, the apply mode alternating, so that every pair and every tp
sees both modes (9 to 12 runs a family). Where tprun deliberately reads a file otherwise than diffusers 0.40
(FLUX.1 kohya's top-level modules, which diffusers drops; FLUX.2's BFL final modulation, which diffusers leaves
unswapped), diffusers gets its own conversion of the file with that one thing corrected (the `prepare` functions,
each saying why). FLUX.1 also runs a file with keys of blocks the model lacks: refused by
default on every rank naming them; with `--lora-strict false` (apply auto) skipped with a warning, the image
diffusers gives (it leaves them out too).
"""
import json
import os
import sys
from dataclasses import dataclass, field

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lora_adapters as la  # noqa: E402
import pipeline_parity as pp  # noqa: E402
from pipeline_families import PROMPT, Call, png_pixels  # noqa: E402
from registered_pipelines import folder_class, init_model  # noqa: E402
from tprun_harness import run_cases  # noqa: E402

TPS = (1, 2, 4)
APPLY = ("fused", "runtime")
EFFECT = 10  # a pair moves diffusers' float image by at least EFFECT x the image tolerance (the test can fail)


@dataclass
class LoraFamily:
    cls: str
    arch: str
    preset: str
    call: Call
    formats: dict          # name -> make(ctx, path, seed)
    pairs: list            # [((format, weight), (format, weight))]
    tolerance: dict = field(default_factory=lambda: {"image": 2e-3, "png": 2})  # png None: a video (frames only)
    patch: object = None   # patch(config): what diffusers needs for a tiny model (a converter's hard-coded widths)
    b_std: float = 0.2     # lora_adapters.B_STD: the size of the adapted term against the module's input
    prepare: dict = field(default_factory=dict)  # format -> fn(pipe, path): what diffusers' load_lora_weights gets
    # (pair, warned text): `--lora-strict false --lora-apply auto` at tp 2 skips the keys tprun maps to no module,
    # warning with `warned` in the line, as diffusers leaves them out; the default (strict) refuses them
    lenient: tuple = None


def all_linears(ctx):
    return list(ctx["linears"])


def block_linears(ctx):
    return [n for n in ctx["linears"] if n.startswith(("transformer_blocks.", "single_transformer_blocks."))]


def peft_formats(ctx_targets, rank_pattern, alpha_pattern):
    """The three diffusers/PEFT files with metadata: alpha != r; rank / alpha patterns; rslora."""
    return {
        "peft": lambda ctx, path, seed: la.make_peft(ctx, path, seed, ctx_targets(ctx), r=4, alpha=2.0),
        "peft_patterns": lambda ctx, path, seed: la.make_peft(ctx, path, seed, ctx_targets(ctx), r=4, alpha=4.0,
                                                              rank_pattern=rank_pattern, alpha_pattern=alpha_pattern),
        "peft_rslora": lambda ctx, path, seed: la.make_peft(ctx, path, seed, ctx_targets(ctx), r=4, alpha=3.0,
                                                            use_rslora=True),
    }


def flux1_kohya_widths(config):
    """diffusers' FLUX.1 kohya converter splits the single blocks' linear1 by FLUX.1-dev's widths (3072 x 3 + 12288,
    hard-coded); for the test's model the same converter with the config's widths, everything else unchanged."""
    import inspect
    import textwrap
    import diffusers.loaders.lora_conversion_utils as lcu
    import diffusers.loaders.lora_pipeline as lp
    inner = config["num_attention_heads"] * config["attention_head_dim"]
    src = textwrap.dedent(inspect.getsource(lcu._convert_kohya_flux_lora_to_diffusers))
    old = "dims=[3072, 3072, 3072, 12288]"
    if src.count(old) != 1:
        raise SystemExit(f"FAIL: diffusers' _convert_kohya_flux_lora_to_diffusers no longer has {old!r}: "
                         "see lora_parity.py")
    src = src.replace(old, f"dims=[{inner}, {inner}, {inner}, {4 * inner}]")
    scope = dict(vars(lcu))
    exec(compile(src, lcu.__file__, "exec"), scope)
    lp._convert_kohya_flux_lora_to_diffusers = scope["_convert_kohya_flux_lora_to_diffusers"]


def clip_keys_for_transformers5(pipe, path):
    """diffusers' own conversion of the file (lora_state_dict), with its CLIP keys renamed for transformers 5:
    diffusers 0.40 names CLIPTextModel's Linears `text_model.encoder.layers.N...` as transformers 4 did, and
    transformers 5 drops the `text_model.` level, so load_lora_weights of the file itself adapts no text-encoder
    Linear (it fails making the config). The mapping stays diffusers'; only the module path moves."""
    sd = pipe.lora_state_dict(path)
    old = "text_encoder.text_model."
    return {("text_encoder." + k[len(old):] if k.startswith(old) else k): v for k, v in sd.items()}


def kohya_top_level_kept(pipe, path):
    """diffusers' own conversion of a kohya FLUX.1 file, its top-level modules kept: the converter maps img_in,
    txt_in, time_in, vector_in, guidance_in and final_layer (that one's up halves swapped, as FLUX.1's checkpoint
    converter swaps norm_out's) but names them without "transformer.", so load_lora_weights of the file drops them
    silently; tprun applies them (src/models/flux_lora_names.cpp, tests/scripts/lora_names_check.py)."""
    return {(k if k.startswith(("transformer.", "text_encoder.")) else "transformer." + k): v
            for k, v in pipe.lora_state_dict(path).items()}


def flux2_output_modulation_swapped(pipe, path):
    """diffusers' own conversion of a BFL FLUX.2 file, norm_out.linear's lora_B halves swapped: diffusers 0.40's
    converter maps final_layer.adaLN_modulation.1 to norm_out.linear unswapped although its checkpoint converter
    swaps that layer's (shift, scale) halves; tprun swaps B's halves as the base weight's were (a deliberate
    difference: src/models/flux2_lora_names.cpp, tests/scripts/lora_names_check.py)."""
    from diffusers.loaders.lora_conversion_utils import swap_scale_shift
    key = "transformer.norm_out.linear.lora_B.weight"
    sd = pipe.lora_state_dict(path)
    if key not in sd:
        raise SystemExit(f"FAIL: diffusers' conversion of {path} has no {key}")
    return {k: (swap_scale_shift(v) if k == key else v) for k, v in sd.items()}


FAMILIES = {f.cls: f for f in [
    LoraFamily(
        "FluxPipeline", "flux", "small",
        Call("lora", PROMPT, seed=7, steps=3, guidance=3.5, max_sequence_length=64),
        formats={**peft_formats(all_linears, {"attn.to_q": 2, "ff.net.0.proj": 6},
                                {"attn.to_out.0": 12.0, "norm1.linear": 1.0}),
                 "kohya": lambda ctx, path, seed: la.make_flux1_kohya(ctx, path, seed),
                 "comfy": lambda ctx, path, seed: la.make_flux1_kohya(ctx, path, seed, comfy=True),
                 "kohya_te": lambda ctx, path, seed: la.make_flux1_kohya_te(ctx, path, seed),
                 "kohya_extra": lambda ctx, path, seed: la.make_flux1_kohya(ctx, path, seed, extra=True),
                 "kohya_top": lambda ctx, path, seed: la.make_flux1_kohya(ctx, path, seed, top=True)},
        pairs=[(("peft", 0.8), ("kohya", 0.6)), (("peft_patterns", 1.0), ("comfy", -0.5)),
               (("peft_rslora", 0.7), ("kohya_top", 1.2)), (("kohya_te", 0.9), ("peft", 0.5))],
        prepare={"kohya_te": clip_keys_for_transformers5, "kohya_top": kohya_top_level_kept},
        lenient=((("kohya_extra", 0.9), ("peft", 0.5)), f"lora_unet_double_blocks_{la.EXTRA_BLOCK}_"),
        patch=flux1_kohya_widths),
    LoraFamily(
        "Flux2KleinPipeline", "flux2-klein", "small",
        Call("lora", PROMPT, seed=3, steps=3, guidance=1.0),
        formats={**peft_formats(all_linears, {"attn.to_q": 2, "ff.linear_in": 6},
                                {"attn.to_out.0": 12.0, "double_stream_modulation_img.linear": 1.0}),
                 "base_model_prefix": lambda ctx, path, seed: la.make_prefixed(ctx, path, seed, block_linears(ctx),
                                                                               "base_model.model."),
                 "bfl": lambda ctx, path, seed: la.make_flux2_bfl(ctx, path, seed),
                 "kohya": lambda ctx, path, seed: la.make_flux2_kohya(ctx, path, seed)},
        pairs=[(("peft", 0.8), ("bfl", 0.6)), (("peft_patterns", 1.0), ("base_model_prefix", -0.5)),
               (("peft_rslora", 0.7), ("kohya", 1.2))],
        prepare={"bfl": flux2_output_modulation_swapped}),
    LoraFamily(
        "QwenImagePipeline", "qwen-image", "small",
        Call("lora", PROMPT, seed=1, steps=3),
        formats={**peft_formats(all_linears, {"attn.to_q": 2, "img_mlp.net.0.proj": 6},
                                {"attn.to_out.0": 12.0, "img_mod.1": 1.0}),
                 "diffusion_model_prefix": lambda ctx, path, seed: la.make_prefixed(ctx, path, seed, all_linears(ctx),
                                                                                    "diffusion_model."),
                 "kohya": lambda ctx, path, seed: la.make_qwen_kohya(ctx, path, seed, all_linears(ctx))},
        pairs=[(("peft", 0.8), ("kohya", 0.6)), (("peft_patterns", 1.0), ("diffusion_model_prefix", -0.5)),
               (("peft_rslora", 0.7), ("kohya", 1.2))],
        b_std=0.5),
    LoraFamily(
        "WanPipeline", "wan", "tiny",
        Call("lora", PROMPT, seed=5, steps=3, frames=5, guidance=1.0, height=48, width=64),
        formats={**peft_formats(all_linears, {"attn1.to_q": 2, "ffn.net.0.proj": 6},
                                {"attn2.to_v": 12.0, "condition_embedder.time_proj": 1.0}),
                 "original": lambda ctx, path, seed: la.make_wan_original(ctx, path, seed)},
        pairs=[(("peft", 0.8), ("original", 0.6)), (("peft_patterns", 1.0), ("original", -0.5)),
               (("peft_rslora", 0.7), ("peft", 1.2))],
        # Frames: WanPipeline's float video (MP4s are lossy, not compared).
        tolerance={"image": 2e-3, "png": None}, b_std=0.6),
]}

H = None
ROWS = []  # (label, image diff, png diff) of every tprun comparison, for the table at the end


def family_folder(fam, work):
    return init_model(H.tprun, os.path.join(work, f"{fam.arch}-{fam.preset}"), fam.arch, "--preset", fam.preset)


def make_adapters(fam, folder, work):
    """{format: path} of the family's adapter files, made from its transformer (seed: the format's index + 100)."""
    import diffusers
    import torch
    index = json.load(open(os.path.join(folder, "model_index.json")))
    transformer = getattr(diffusers, index["transformer"][1]).from_pretrained(os.path.join(folder, "transformer"),
                                                                                torch_dtype=torch.float32)
    config = json.load(open(os.path.join(folder, "transformer", "config.json")))
    ctx = {"transformer": transformer, "linears": la.linears(transformer), "config": config,
           "pipe_cls": getattr(diffusers, fam.cls), "folder": folder}
    files = {}
    d = os.path.join(work, "adapters")
    os.makedirs(d, exist_ok=True)
    for i, (name, make) in enumerate(fam.formats.items()):
        files[name] = make(ctx, os.path.join(d, f"{name}.safetensors"), 100 + i)
        print(f"adapter {name}: {la.describe(files[name])}", flush=True)
    return files


def references(fam, pipe, files, call):
    """[(pair, image)] of diffusers with each pair stacked (then the lenient pair's), and the checks of diffusers
    itself: each pair moves the image by EFFECT x the tolerance at least, unloading gives the base image back, and
    the first pair fused (`fuse_lora`) gives its unfused image within the tolerance (last: unfusing leaves the base
    weights off by rounding)."""
    _, kw = pp.call_args(call)

    def image():
        return pp.diffusers_call(pipe, call.prompt, call.seed, call.steps, call.height, call.width, **kw)[1]

    def load(i, pair):
        names = [f"p{i}_{fmt}" for fmt, _ in pair]
        for (fmt, _), name in zip(pair, names):
            pipe.load_lora_weights(fam.prepare[fmt](pipe, files[fmt]) if fmt in fam.prepare else files[fmt],
                                   adapter_name=name)
            if i not in counted:  # how many Linears diffusers adapted from the file, per component
                counts = {c: sum(1 for m in getattr(pipe, c).modules() if name in getattr(m, "lora_A", {}))
                          for c in ("transformer", "text_encoder") if getattr(pipe, c, None) is not None}
                H.check(counts["transformer"] > 0, f"diffusers adapts {counts} Linears from {fmt}")
        counted.add(i)
        pipe.set_adapters(names, adapter_weights=[w for _, w in pair])
        return names
    counted = set()
    base = image()
    refs = []
    for i, pair in enumerate(fam.pairs):
        load(i, pair)
        img = image()
        pipe.unload_lora_weights()
        effect, least = np.abs(img - base), EFFECT * fam.tolerance["image"]
        H.check(np.isfinite(img).all() and effect.max() >= least,
                f"diffusers {pair_label(pair)}: the image moves by {effect.max():.3f} at most (at least {least:.3g}), "
                f"{effect.mean():.3f} on average, finite, std {img.std():.3f} (base {base.std():.3f})")
        refs.append((pair, img))
    if fam.lenient:
        load("lenient", fam.lenient[0])
        refs.append((fam.lenient[0], image()))
        pipe.unload_lora_weights()
    H.check(np.array_equal(image(), base), "diffusers after unload_lora_weights: the base image again")
    names = load(0, fam.pairs[0])
    pipe.fuse_lora(adapter_names=names)
    H.within(f"diffusers fuse_lora == unfused, {pair_label(fam.pairs[0])}", image(), refs[0][1], fam.tolerance["image"])
    pipe.unfuse_lora()
    pipe.unload_lora_weights()
    return refs


def pair_label(pair):
    return " + ".join(f"{fmt}@{w:g}" for fmt, w in pair)


def lora_flags(pair, files, apply):
    flags = []
    for fmt, w in pair:
        flags += ["--lora", files[fmt], "--lora-scale", repr(float(w))]
    return flags + ["--lora-apply", apply]


def compare_tprun(fam, folder, files, pair, ref_img, tp, apply, work, extra=(), warned=None):
    flags, _ = pp.call_args(fam.call)
    flags = [*flags, *extra]
    label = f"{fam.cls} {pair_label(pair)} tp {tp} {apply}" + (f" {' '.join(extra)}" if extra else "")
    tag = "".join(c if c.isalnum() else "_" for c in label)
    got, png_or_rc, log = generate(tag, folder, fam.call, [*flags, *lora_flags(pair, files, apply)], tp, work)
    if got is None:
        H.check(False, f"{label} ran: exit {png_or_rc}: {log[-1500:]}")
        ROWS.append((label, None, None))
        return
    if warned is not None:
        n = sum(1 for line in log.splitlines() if warned in line and "warn" in line)
        H.check(n >= 1, f"{label}: a warning names the skipped keys ({warned}) on {n} rank(s)")
    d_img = float(np.abs(np.asarray(got["image"], np.float64) - ref_img).max()) \
        if got["image"].shape == ref_img.shape else float("inf")
    H.check(d_img <= fam.tolerance["image"], f"{label}: image max abs diff {d_img:.3g} "
            f"(tolerance {fam.tolerance['image']:.3g})" + ("" if got["image"].shape == ref_img.shape
                                                          else f", shapes {got['image'].shape} vs {ref_img.shape}"))
    d_png = None
    if fam.tolerance["png"] is not None:
        d_png = float(np.abs(png_pixels(png_or_rc) - np.round(ref_img[0] * 255)).max())
        H.check(d_png <= fam.tolerance["png"], f"{label}: PNG max abs diff {d_png:g} levels "
                f"(tolerance {fam.tolerance['png']})")
    ROWS.append((label, d_img, d_png))


def refused(label, rc, log, text, tp, why):
    """A refusal: exit 3 or 4, `text` in an error line of every rank."""
    lines = [line for line in log.splitlines() if text in line and "error" in line]
    return H.check(rc in (3, 4) and len(lines) >= tp, f"{label}: refused (exit {rc}) on {len(lines)} of {tp} ranks, "
                   f"naming {text} ({why}): {lines[0].strip()[:400] if len(lines) >= tp else log[-1500:]}")


def generate(tag, folder, call, flags, tp, work):
    """(tensors, png path, log) of `tprun generate` at tp, as pipeline_parity.tprun_generate runs it, with the
    whole log (every rank's lines); (None, exit code, log) when it failed. A video's "video" is returned as
    "image" [1, F, H, W, 3]."""
    from safetensors.numpy import load_file
    video = call.frames is not None and call.frames != 1
    out, png = os.path.join(work, f"{tag}.safetensors"), os.path.join(work, f"{tag}.{'mp4' if video else 'png'}")
    rc, log = H.run(["generate", "--model", folder, "--prompt", call.prompt, "--height", str(call.height), "--width",
                     str(call.width), "--steps", str(call.steps), "--seed", str(call.seed), "--out", png,
                     "--out-tensors", out, *flags], np_=tp)
    if rc != 0:
        return None, rc, log
    got = load_file(out)
    if video:
        got["image"] = got.pop("video")[None]
    return got, png, log


def runs(fam, mode):
    """[(pair index, tp, apply)] of the mode."""
    if mode == "all":
        return [(i, tp, a) for i in range(len(fam.pairs)) for tp in TPS for a in APPLY]
    return [(i, tp, APPLY[(i + j) % 2]) for i in range(len(fam.pairs)) for j, tp in enumerate(TPS)]


def case_family(fam, mode, work):
    import torch
    pp.H, pp.WORK = H, work
    folder = family_folder(fam, work)
    if folder_class(folder) != fam.cls:
        raise SystemExit(f"FAIL: init-model --arch {fam.arch} wrote a {folder_class(folder)} folder, not {fam.cls}")
    config = json.load(open(os.path.join(folder, "transformer", "config.json")))
    if fam.patch:
        fam.patch(config)
    la.set_b_std(fam.b_std)
    files = make_adapters(fam, folder, work)
    torch.set_num_threads(2)
    pipe = pp.load_pipe(folder)
    pipe.set_progress_bar_config(disable=True)
    refs = references(fam, pipe, files, fam.call)
    alone = []
    if mode == "all":  # each format alone at weight 1, tp 1, run-time: which format disagrees, when one does
        for fmt in dict.fromkeys(fmt for pair in fam.pairs for fmt, _ in pair):
            pipe.load_lora_weights(fam.prepare[fmt](pipe, files[fmt]) if fmt in fam.prepare else files[fmt],
                                   adapter_name=fmt)
            _, img = pp.diffusers_call(pipe, fam.call.prompt, fam.call.seed, fam.call.steps, fam.call.height,
                                       fam.call.width, **pp.call_args(fam.call)[1])
            pipe.unload_lora_weights()
            alone.append((((fmt, 1.0),), img))
    del pipe
    for pair, img in alone:
        compare_tprun(fam, folder, files, pair, img, 1, "runtime", work)
    if mode == "refs":
        return
    for i, tp, apply in runs(fam, mode):
        pair, img = refs[i]
        compare_tprun(fam, folder, files, pair, img, tp, apply, work)
    if fam.lenient:  # strict (the default) refuses the keys that map to no module; --lora-strict false skips them
        pair, img = refs[len(fam.pairs)]
        label = f"{fam.cls} {pair_label(pair)} tp 2 auto"
        got, rc, log = generate("strict", folder, fam.call, [*pp.call_args(fam.call)[0],
                                                             *lora_flags(pair, files, "auto")], 2, work)
        refused(label, rc if got is None else 0, log, fam.lenient[1], 2, "lora_strict = true, the default")
        compare_tprun(fam, folder, files, pair, img, 2, "auto", work, extra=("--lora-strict", "false"),
                      warned=fam.lenient[1])


def main():
    global H
    if len(sys.argv) < 4 or sys.argv[3] not in FAMILIES:
        raise SystemExit(f"usage: lora_parity.py TPRUN MPIRUN CLASS [ci|all|refs]; CLASS: {', '.join(FAMILIES)}")
    H = pp.ParityHarness(sys.argv[1], sys.argv[2])
    fam = FAMILIES[sys.argv[3]]
    mode = sys.argv[4] if len(sys.argv) > 4 else "ci"
    if mode not in ("ci", "all", "refs"):
        raise SystemExit(f"lora_parity.py: MODE is ci, all or refs, not {mode!r}")

    def body(work):
        try:
            case_family(fam, mode, work)
        finally:
            if ROWS:
                print("\n| run | image max abs diff | PNG max abs diff (levels) |\n|---|---|---|")
                for label, d_img, d_png in ROWS:
                    print(f"| {label} | {'failed' if d_img is None else f'{d_img:.3g}'} | "
                          f"{'-' if d_png is None else f'{d_png:g}'} |")
    return run_cases(H, {fam.cls: body}, "tprun-lora-parity")


if __name__ == "__main__":
    sys.exit(main())
