#!/usr/bin/env python3
"""Parity of tprun's Qwen-Image transformer (QwenImageTransformer2DModel) with the real diffusers class.

Every model is diffusers' own class, built at test time with EVERY parameter redrawn from a
seeded generator (matrices ~ N(0, clamp(1/sqrt(fan_in), 0.02, 0.2)), biases ~ N(0, 0.05), norm
weights ~ N(1, 0.1): diffusers' default init leaves every RMSNorm weight at 1 and would hide a
swapped or missing norm), saved with save_pretrained. Inputs are made as QwenImagePipeline passes
them: packed latents [B, h*w, in_channels], prompt embeddings [B, S_txt, joint_attention_dim] with
their mask (1 = token, 0 = padding), timestep t / 1000, img_shapes [(1, h, w)] per sample (h, w
in patches). tprun gets img_shapes as an int64 tensor [B, 3] ([B, N, 3] for N images a sample).

Cases (one ctest entry each; `qwen_image_parity.py TPRUN MPIRUN [CASE ...]`, all when none given):
  table       `tprun inspect --json --tp 2` against state_dict names and shapes and diffusers'
              `_tp_plan` (each tensor's style and plan_key), for a small, an odd and the real
              width; the same table from a config.json without its default-valued fields.
  forward     fp32, max abs diff <= 1e-4 against diffusers: a small config (4 heads x 16, 2
              blocks) with a padded text mask at tp 1, 2, 4, where the mask is shown to change
              diffusers' output (and tprun without the mask input matches diffusers without
              one); tp 2 with --shard-modulation; an odd config (6 heads x 12, 5 x 3 grid, 5 text
              tokens, batch 2 with different non-contiguous masks, guidance_embeds and
              use_additional_t_cond on) at tp 1, 2, 3.
  variants    two images a sample (img_shapes [B, 2, 3], as the Edit pipelines pass them) at tp 2,
              also with the masked attention's queries in chunks (--memory attention_chunk=5);
              zero_cond_t (shown to change diffusers' output) with two images a sample at tp 1, 2
              and 2 with --shard-modulation.
  wide        one block at the real width (3072 = 24 heads x 128, joint_attention_dim 3584,
              in_channels 64; ~0.35 B parameters) at tp 1 and 2, held to WIDE_REL_TOL x max|sample|
              (see there).
  bf16        diffusers in bf16 against `tprun forward --dtype bf16` (small config, tp 1, 2, 4),
              held to BF16_TOL (see there).
  allreduce   `tprun verify --tp 2` (tp 1 vs tp 2 on the model's example inputs, which carry a
              padded mask) passes and prints "all_reduce calls per forward: N (plan: M)" with
              N == M == 2 * num_layers, + 1 with --shard-modulation.
  validation  refused on every rank with a non-zero exit: a tp that does not divide
              num_attention_heads (before any weight byte: the message is the plan check's); a
              checkpoint tensor of the wrong shape; use_layer3d_rope by name, and zero_cond_t with
              use_additional_t_cond (a combination diffusers cannot run for a batch over 1).
  inputs      a missing img_shapes, one that does not match the tokens, a mask of the wrong length:
              each a RequestError naming the input, on every rank.
"""
import json
import os
import shutil
import sys
import tempfile
import time

import torch
from diffusers import QwenImageTransformer2DModel
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_parity as parity  # noqa: E402  (shared runs and checks)
from transformer_parity import check, compare, expect_refusal, tprun_forward, tprun_inspect  # noqa: E402

SMALL_TOL = 1e-4
# Wide: the 3072..12288-wide fp32 dot products sum in an order that differs between TP slices
# (partial sums reduced across ranks) and between kernels, so rounding noise grows with width and
# with the output's scale. Measured (seed 20, one block, 4 x 4 grid, 8 text tokens, 2 padded):
# 1.2e-6 at tp 1 and 1.1e-6 at tp 2 (3e-7 of max|sample| 3.9), so the bound (1.9e-4 here) leaves
# > 100x for other BLAS/oneDNN builds and is far below what a real bug gives (the mask alone moves
# the small model's output by 0.1 .. 0.25; the bf16-rounded timestep frequencies moved it by 0.29).
WIDE_REL_TOL = 5e-5
# bf16, measured on SMALL (padded mask) over seeds 30..32 at tp 1, 2, 4: max abs diff 1.56e-2 ..
# 1.76e-2 with max|sample| 2.9 .. 4.8, i.e. one bf16 ulp (1.56e-2 at 2..4, 3.1e-2 at 4..8): not 0 at
# tp 1 because the RoPE rotation (diffusers' complex product vs x cos + rot(x) sin) and the SDPA
# calls round differently. A real bf16 bug is far larger: the timestep frequencies rounded to bf16
# (as the unused get_timestep_embedding copy in transformer_qwenimage.py does) moved the output by
# 0.29. About 3x the largest measured:
BF16_TOL = 0.05
MASK_MIN_EFFECT = 1e-3

SMALL = dict(num_layers=2, attention_head_dim=16, num_attention_heads=4, in_channels=16, out_channels=4,
             joint_attention_dim=24, axes_dims_rope=(4, 6, 6), patch_size=2)
ODD = dict(num_layers=1, attention_head_dim=12, num_attention_heads=6, in_channels=10, out_channels=3,
           joint_attention_dim=14, axes_dims_rope=(2, 4, 6), patch_size=2, guidance_embeds=True,
           use_additional_t_cond=True)
WIDE = dict(num_layers=1, attention_head_dim=128, num_attention_heads=24, in_channels=64, out_channels=16,
            joint_attention_dim=3584, axes_dims_rope=(16, 56, 56), patch_size=2)

# ---------------------------------------------------------------------------------------------
# models, inputs, runs


def rebuild_pos_embed(model):
    """QwenEmbedRope's tables are plain attributes (not buffers): to_empty leaves them alone, but
    they were made on the meta device; rebuild the module on the CPU."""
    model.pos_embed = type(model.pos_embed)(theta=10000, axes_dim=list(model.config.axes_dims_rope),
                                            scale_rope=True)


def build_model(cfg, seed, init=True):
    """diffusers' class with every parameter redrawn from a seeded generator (fp32, CPU): biases ~
    N(0, 0.05); the other 1-d parameters are RMSNorm weights (txt_norm, norm_q/k, norm_added_q/k)."""
    return parity.build_model(QwenImageTransformer2DModel, cfg, seed, init, bias_std=0.05,
                              after_empty=rebuild_pos_embed)


def make_inputs(cfg, images, txt, seed, batch=1, masks=None):
    """images: [(frames, h, w), ...] of one sample (the same for every sample); masks: per sample
    lists of 0/1 (None: no mask input)."""
    g = torch.Generator().manual_seed(seed + 1000)
    tokens = sum(f * h * w for f, h, w in images)
    inputs = {
        "hidden_states": torch.randn(batch, tokens, cfg["in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        "timestep": torch.tensor([700.0, 300.0, 500.0][:batch]) / 1000,
    }
    shapes = torch.tensor([list(s) for s in images], dtype=torch.int64)
    one = shapes[0] if len(images) == 1 else shapes  # [3] or [N, 3]
    inputs["img_shapes"] = one[None].expand(batch, *one.shape)
    if masks is not None:
        inputs["encoder_hidden_states_mask"] = torch.tensor(masks, dtype=torch.int64)
    if cfg.get("use_additional_t_cond"):
        inputs["additional_t_cond"] = torch.tensor([0, 1, 1][:batch], dtype=torch.int64)
    return {k: v.contiguous() for k, v in inputs.items()}


def diffusers_forward(model, inputs, dtype=torch.float32, drop_mask=False):
    args = {}
    for k, v in inputs.items():
        if k == "img_shapes":
            shapes = v if v.dim() == 3 else v[:, None]
            args[k] = [[tuple(int(x) for x in s) for s in sample] for sample in shapes]
        elif k == "encoder_hidden_states_mask":
            if not drop_mask:
                args[k] = v
        elif v.is_floating_point():
            args[k] = v.to(dtype)
        else:
            args[k] = v
    with torch.no_grad():
        return model(**args, return_dict=False)[0].float()


class Work(parity.Work):
    """A Qwen-Image model saved in a temporary folder with its inputs and diffusers' output."""

    def __init__(self, name, cfg, seed, images=((1, 4, 4),), txt=8, batch=1, masks=None, dtype=torch.float32):
        super().__init__("tprun_qwen_image", name, cfg, seed, build_model,
                         lambda: make_inputs(cfg, list(images), txt, seed, batch, masks), diffusers_forward, dtype)
        p = cfg.get("patch_size", 2)
        assert self.expected.shape == (batch, self.inputs["hidden_states"].shape[1], p * p * cfg["out_channels"])


# ---------------------------------------------------------------------------------------------
# cases


def plan_entry(module_name):
    return parity.plan_entry(QwenImageTransformer2DModel._tp_plan, module_name)


def case_table():
    for name, cfg in (("small", SMALL), ("odd", ODD), ("wide", WIDE)):
        model = build_model(cfg, 0, init=False)
        d = tempfile.mkdtemp(prefix=f"tprun_qwen_image_table_{name}_")
        try:
            # Shapes and names are all `inspect` reads: bf16 halves the bytes written at full width.
            (model.to(torch.bfloat16) if name == "wide" else model).save_pretrained(d)
            r = tprun_inspect(d)
            if not check(r.returncode == 0, f"table {name}: tprun inspect exit {r.returncode} {r.stderr[-500:]}"):
                continue
            comp = json.loads(r.stdout)["components"][0]
            ours = {t["name"]: t for t in comp["tensors"]}
            theirs = {k: list(v.shape) for k, v in model.state_dict().items()}
            check(set(ours) == set(theirs),
                  f"table {name}: names (only tprun {sorted(set(ours) - set(theirs))[:4]}, "
                  f"only diffusers {sorted(set(theirs) - set(ours))[:4]})")
            bad = 0
            for tname, shape in theirs.items():
                if tname not in ours:
                    continue
                module, leaf = tname.rsplit(".", 1)
                key, style = plan_entry(module)
                expected = "replicated" if style is None else style
                if leaf == "bias" and style == "rowwise":
                    expected = "replicated"  # whole on every rank, added once after the reduce
                t = ours[tname]
                if t["shape"] != shape or t["plan"] != expected or (key and t.get("plan_key") != key):
                    bad += 1
                    check(False, f"table {name}: {tname}: tprun {t['shape']} {t['plan']} {t.get('plan_key')}, "
                                 f"diffusers {shape} {expected} {key}")
            planned = sum(1 for t in theirs if plan_entry(t.rsplit(".", 1)[0])[0])
            check(comp["tp"]["valid"], f"table {name}: tp 2 valid ({comp['tp'].get('error', '')})")
            check(bad == 0, f"table {name}: {len(theirs)} tensors ({planned} under _tp_plan), "
                            f"names/shapes/plan/plan_key match diffusers")
            # The same table from a config.json without the fields equal to diffusers' defaults.
            parity.check_defaults_stripped(name, d, QwenImageTransformer2DModel, comp["tensors"])
        finally:
            shutil.rmtree(d, ignore_errors=True)
        del model


def case_forward():
    # small: one sample, its last 3 of 8 text tokens padding.
    w = Work("small", SMALL, seed=10, images=((1, 4, 4),), txt=8, masks=[[1, 1, 1, 1, 1, 0, 0, 0]])
    try:
        unmasked = diffusers_forward(w.model, w.inputs, drop_mask=True)
        effect = (unmasked - w.expected).abs().max().item()
        check(effect > MASK_MIN_EFFECT, f"forward small: the text mask changes diffusers' output by {effect:.3g}")
        for tp in (1, 2, 4):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
            compare(f"forward small (padded mask) tp {tp}", sample, w.expected, SMALL_TOL, err)
        sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out("shardmod"), 2, extra=("--shard-modulation",))
        compare("forward small tp 2 --shard-modulation", sample, w.expected, SMALL_TOL, err)
        no_mask = {k: v for k, v in w.inputs.items() if k != "encoder_hidden_states_mask"}
        sample, err = tprun_forward(w.model_dir, w.save_inputs("nomask", no_mask), w.out("nomask"), 2)
        compare("forward small without a mask input tp 2 (vs diffusers without one)", sample, unmasked, SMALL_TOL,
                err)
    finally:
        w.close()
    # odd: a 5 x 3 grid, 5 text tokens, a batch of 2 with different (non-contiguous) masks.
    w = Work("odd", ODD, seed=11, images=((1, 5, 3),), txt=5, batch=2, masks=[[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    try:
        effect = (diffusers_forward(w.model, w.inputs, drop_mask=True) - w.expected).abs().max().item()
        check(effect > MASK_MIN_EFFECT, f"forward odd: the text masks change diffusers' output by {effect:.3g}")
        for tp in (1, 2, 3):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
            compare(f"forward odd (batch 2, two masks, additional_t_cond) tp {tp}", sample, w.expected, SMALL_TOL,
                    err)
    finally:
        w.close()


def case_variants():
    # Two images a sample (frames index 0 and 1, as the Edit pipelines pass a target and a condition).
    w = Work("multi", SMALL, seed=12, images=((1, 2, 4), (1, 3, 2)), txt=6, batch=2,
             masks=[[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    try:
        sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out("tp2"), 2)
        compare("forward two images a sample (img_shapes [2, 2, 3]) tp 2", sample, w.expected, SMALL_TOL, err)
        # The masked attention with the queries in chunks of 5 (20 tokens: 4 calls).
        sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out("chunk"), 2,
                                    extra=("--memory", "attention_chunk=5"))
        compare("forward two images a sample tp 2 --memory attention_chunk=5", sample, w.expected, SMALL_TOL, err)
    finally:
        w.close()
    # zero_cond_t (Qwen-Image-Edit-2511): the second image's tokens take the timestep-0 modulation.
    w = Work("zero_cond", dict(SMALL, num_layers=1, zero_cond_t=True), seed=13, images=((1, 2, 4), (1, 3, 2)),
             txt=6, batch=2, masks=[[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    try:
        plain = build_model(dict(SMALL, num_layers=1), 0, init=False)
        plain.load_state_dict(w.model.state_dict())
        effect = (diffusers_forward(plain, w.inputs) - w.expected).abs().max().item()
        check(effect > MASK_MIN_EFFECT, f"forward zero_cond_t: the flag changes diffusers' output by {effect:.3g}")
        for tp, extra in ((1, ()), (2, ()), (2, ("--shard-modulation",))):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp, extra=extra)
            compare(f"forward zero_cond_t, two images a sample tp {tp} {' '.join(extra)}".rstrip(), sample,
                    w.expected, SMALL_TOL, err)
    finally:
        w.close()


def case_wide():
    t0 = time.time()
    w = Work("wide", WIDE, seed=20, images=((1, 4, 4),), txt=8, masks=[[1] * 6 + [0] * 2])
    del w.model
    try:
        tol = WIDE_REL_TOL * w.expected.abs().max().item()
        print(f"  built and ran diffusers in {time.time() - t0:.1f}s", flush=True)
        for tp in (1, 2):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp, timeout=400)
            compare(f"wide 24 x 128 tp {tp}", sample, w.expected, tol, err)
    finally:
        w.close()


def case_bf16():
    w = Work("bf16", SMALL, seed=30, images=((1, 4, 4),), txt=8, masks=[[1, 1, 1, 1, 1, 1, 0, 0]],
             dtype=torch.bfloat16)
    try:
        for tp in (1, 2, 4):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp, dtype="bf16")
            compare(f"bf16 tp {tp}", sample, w.expected, BF16_TOL, err)
    finally:
        w.close()


def case_allreduce():
    cfg = SMALL
    w = Work("allreduce", cfg, seed=50)
    try:
        parity.check_allreduce_count(w.model_dir, 2 * cfg["num_layers"], f"2 * {cfg['num_layers']}")
    finally:
        w.close()


def case_validation():
    base = tempfile.mkdtemp(prefix="tprun_qwen_image_validation_")
    try:
        def saved(name, cfg, seed):
            d = os.path.join(base, name)
            build_model(cfg, seed).save_pretrained(d)
            ins = os.path.join(base, f"{name}_inputs.safetensors")
            save_file(make_inputs(cfg, [(1, 4, 4)], 4, seed), ins)
            return d, ins

        def forward_args(d, ins, tp):
            return ["forward", "--model", d, "--inputs", ins, "--out", os.path.join(base, "never.safetensors"),
                    "--tp", str(tp)]

        small = dict(num_layers=1, attention_head_dim=8, num_attention_heads=6, in_channels=8, out_channels=2,
                     joint_attention_dim=12, axes_dims_rope=(2, 2, 4))
        d, ins = saved("heads6", small, 60)
        expect_refusal("validation tp 4 vs 6 heads", 4, forward_args(d, ins, 4),
                       ["tp 4 does not divide num_attention_heads 6"])
        # A tensor of the wrong shape, rewritten with safetensors' API.
        d, ins = saved("wrong_shape", small, 61)
        parity.expect_wrong_shape_refused(d, forward_args(d, ins, 2), "transformer_blocks.0.txt_mlp.net.2.weight")
        # The variants tprun does not run, each refused by name.
        for flags, words in (({"use_layer3d_rope": True}, ["'use_layer3d_rope'", "not supported"]),
                             ({"zero_cond_t": True, "use_additional_t_cond": True},
                              ["'zero_cond_t'", "'use_additional_t_cond'", "both true"])):
            label = "+".join(flags)
            d, ins = saved(label, dict(small, num_attention_heads=4), 62)
            cfg_path = os.path.join(d, "config.json")
            cfg = json.load(open(cfg_path))
            cfg.update(flags)
            json.dump(cfg, open(cfg_path, "w"))
            expect_refusal(f"validation {label}", 2, forward_args(d, ins, 2), words)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def case_inputs():
    """Missing and mis-shaped inputs: a RequestError naming the input, on every rank."""
    base = tempfile.mkdtemp(prefix="tprun_qwen_image_inputs_")
    try:
        cfg = dict(num_layers=1, attention_head_dim=8, num_attention_heads=4, in_channels=8, out_channels=2,
                   joint_attention_dim=12, axes_dims_rope=(2, 2, 4))
        d = os.path.join(base, "model")
        build_model(cfg, 63).save_pretrained(d)
        ins = os.path.join(base, "inputs.safetensors")
        save_file(make_inputs(cfg, [(1, 4, 4)], 4, 63), ins)
        good = load_file(ins)
        for label, change, words in (
                ("missing img_shapes", lambda t: t.pop("img_shapes"), ["input 'img_shapes' is missing"]),
                ("img_shapes not matching the tokens", lambda t: t.update(img_shapes=torch.tensor([[1, 4, 5]])),
                 ["input 'img_shapes' gives 20 image tokens", "'hidden_states' has 16"]),
                ("mask of the wrong length", lambda t: t.update(encoder_hidden_states_mask=torch.ones(1, 3)),
                 ["input 'encoder_hidden_states_mask' must be [1, 4]"])):
            bad_inputs = dict(good)
            change(bad_inputs)
            path = os.path.join(base, "bad_inputs.safetensors")
            save_file(bad_inputs, path)
            expect_refusal(f"inputs {label}", 2, ["forward", "--model", d, "--inputs", path, "--out",
                                                  os.path.join(base, "never.safetensors"), "--tp", "2"], words)
    finally:
        shutil.rmtree(base, ignore_errors=True)


CASES = {"table": case_table, "forward": case_forward, "variants": case_variants, "wide": case_wide, "bf16": case_bf16,
         "allreduce": case_allreduce, "validation": case_validation, "inputs": case_inputs}


if __name__ == "__main__":
    sys.exit(parity.main(CASES))
