#!/usr/bin/env python3
"""Parity of tprun's FLUX.2 transformer (Flux2Transformer2DModel) with the real diffusers class.

Every model is diffusers' own class, built at test time with EVERY parameter redrawn from a
seeded generator (weights with ndim >= 2 ~ N(0, clamp(1/sqrt(fan_in), 0.02, 0.2)), RMSNorm
weights ~ N(1, 0.1): diffusers' default init leaves every QK-norm weight at 1, which would hide a
swapped or missing norm), saved with save_pretrained. Inputs are made as Flux2Pipeline makes
them: packed latents [B, H*W, in_channels], image ids (0, row, col, 0)
from _prepare_latent_ids, text ids (0, 0, 0, l) from _prepare_text_ids (int64 [B, S, 4] as the
pipeline passes them in one config, float [S, 4] in the others), timestep t/1000, guidance where
the model has guidance_embeds.

Cases (one ctest entry each; `flux2_parity.py TPRUN MPIRUN [CASE ...]`, all when none given):
  table       `tprun inspect --json --tp 2` against state_dict names and shapes and `_tp_plan`:
              each planned tensor's style and plan_key; the component's "tp_plan" blocks against
              diffusers' PackedColwiseParallel([1, 1]) (as proportions) and the
              `_tp_packed_col_blocks` / `_tp_packed_row_blocks` stored on the Linear modules.
  forward     fp32, max abs diff <= 1e-4 against diffusers' forward: a config with klein's shape
              ratios (4 heads x 32, mlp_ratio 3, no guidance embedder, 2 double + 3 single
              blocks) at tp 1, 2, 4, and one with odd sizes (6 heads x 12, mlp 216, guidance
              embedder, patch_size 2 with out_channels 8, a 4 x 6 grid, 5 text tokens, a batch of
              2 with its own timesteps and guidance, int64 [B, S, 4] ids) at tp 1, 2; both also at
              tp 2 with --shard-modulation.
  wide        one double and one single block at FLUX.2 klein-4B's width (3072 = 24 heads x 128,
              joint_attention_dim 7680, in_channels 128; ~600M parameters, 2.4 GB fp32) at tp 1
              and 2. Tolerance 5e-5 x max|sample|: the 3072..18432-wide fp32 dot products sum in
              an order that differs between diffusers' and tprun's kernels and between TP slices
              (partial sums reduced across ranks), so the rounding noise grows with width and with
              the output's scale. Measured: 0 at tp 1 (same kernels, same order), 1.2e-6 at tp 2
              (3e-7 of max|sample| 4.1), so the bound (2e-4 here) leaves > 100x for other
              BLAS/oneDNN builds and is far below what a real bug gives (the packed case: one
              block's slice on one rank perturbed moves a small model's output by 3e-2 .. 3).
  bf16        diffusers in bf16 against `tprun forward --dtype bf16` (small config, tp 1, 2, 4),
              held to BF16_TOL (see there: ~3x the largest difference measured).
  packed      each rank holds ITS slice of EVERY packed block. For each packed tensor
              (single attn.to_qkv_mlp_proj: q|k|v|gate|up, double ff.linear_in and
              ff_context.linear_in: gate|up, single attn.to_out: attn|mlp columns) and each of its
              blocks, only the rows (columns for to_out) that tp-2 rank 1 holds of that block under
              the packed split are perturbed; diffusers' output on that checkpoint must move
              (> 1e-2) and `tprun forward --tp 2` on it must match diffusers' within 1e-4. This is
              the check that fails under a plain (contiguous 1/tp) split, where rank 0 would hold
              q, k, v and half of the gate and the ratio split would hand one block's rows to
              another. The case proves it with a negative control per tensor: the tensor reordered
              so that tprun's packed slices are exactly the plain slices of the original; tprun's
              tp-2 output on that must (and does) disagree with diffusers' by > 1e-2.
  allreduce   `tprun verify --model DIR --tp 2` (tp 1 vs tp 2 on the same inputs, every block
              compared) passes and prints "all_reduce calls per forward: N (plan: M)" with
              N == M == 2 * num_layers + num_single_layers, and + 1 with --shard-modulation.
  validation  refused before any byte, on every rank, non-zero exit, no hang: a tp that does not
              divide num_attention_heads; a packed block that tp does not divide (mlp hidden 97,
              in ff.linear_in and, with no double blocks, in to_qkv_mlp_proj); a checkpoint
              tensor of the wrong shape (rewritten with safetensors' API).
"""
import json
import math
import os
import shutil
import sys
import tempfile
import time

import torch
from diffusers import Flux2Transformer2DModel
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_parity as parity  # noqa: E402  (shared runs and checks)
from transformer_parity import check, compare, expect_refusal, tprun_forward, tprun_inspect  # noqa: E402

SMALL_TOL = 1e-4
WIDE_REL_TOL = 5e-5
# bf16, measured on BF16_CONFIG over seeds 30..32: max abs diff 0 at tp 1 (the same bf16 ops in
# the same order as diffusers, torch.nn.RMSNorm's fp32 weight product included), 1.56e-2 at tp 2
# and 4 (the partial sums of the row-wise layers round to bf16 before the reduce), with
# max|sample| 3.4..4, where one bf16 ulp is 1.56e-2 .. 3.1e-2. (klein_small and odd: at most
# 2.3e-2 / 3.1e-2.) About 3x the test config's measurement:
BF16_TOL = 0.05
PACKED_MIN_EFFECT = 1e-2

KLEIN_SMALL = dict(num_layers=2, num_single_layers=3, attention_head_dim=32, num_attention_heads=4, in_channels=16,
                   joint_attention_dim=48, mlp_ratio=3.0, axes_dims_rope=(8, 8, 8, 8), guidance_embeds=False)
ODD = dict(num_layers=1, num_single_layers=2, attention_head_dim=12, num_attention_heads=6, in_channels=10,
           joint_attention_dim=20, mlp_ratio=3.0, axes_dims_rope=(2, 4, 2, 4), guidance_embeds=True,
           patch_size=2, out_channels=8, timestep_guidance_channels=64, rope_theta=500)
KLEIN_4B_WIDTH = dict(num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=24,
                      in_channels=128, joint_attention_dim=7680, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
                      guidance_embeds=False)
BF16_CONFIG = dict(KLEIN_SMALL, num_layers=1, num_single_layers=2)
PACKED_CONFIG = dict(num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=4, in_channels=8,
                     joint_attention_dim=24, mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)

# ---------------------------------------------------------------------------------------------
# models, inputs, runs


def build_model(cfg, seed, init=True):
    """diffusers' class with every parameter redrawn from a seeded generator (fp32, CPU). The 1-d
    parameters are RMSNorm weights (norm_q/k, norm_added_q/k); there are no biases."""
    return parity.build_model(Flux2Transformer2DModel, cfg, seed, init)


def latent_ids(h, w):
    """Flux2Pipeline._prepare_latent_ids for one latent of h x w: (0, row, col, 0)."""
    return torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))


def text_ids(n):
    """Flux2Pipeline._prepare_text_ids for n tokens: (0, 0, 0, l)."""
    return torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(n))


def make_inputs(cfg, grid, txt, seed, batched_int_ids=False, batch=1):
    g = torch.Generator().manual_seed(seed + 1000)
    h, w = grid
    # prepare_latents: [B, C, H, W] noise, packed to [B, H*W, C].
    latents = torch.randn(batch, cfg["in_channels"], h, w, generator=g)
    inputs = {
        "hidden_states": latents.reshape(batch, cfg["in_channels"], h * w).permute(0, 2, 1),
        "encoder_hidden_states": torch.randn(batch, txt, cfg["joint_attention_dim"], generator=g),
        "timestep": torch.tensor([700.0, 300.0][:batch]) / 1000,
    }
    if batched_int_ids:  # as the pipeline passes them: int64 [B, S, 4]
        inputs["img_ids"] = latent_ids(h, w)[None].expand(batch, -1, -1)
        inputs["txt_ids"] = text_ids(txt)[None].expand(batch, -1, -1)
    else:
        inputs["img_ids"], inputs["txt_ids"] = latent_ids(h, w).float(), text_ids(txt).float()
    if cfg.get("guidance_embeds", True):
        inputs["guidance"] = torch.tensor([4.0, 2.5][:batch])
    return {k: v.contiguous() for k, v in inputs.items()}


def diffusers_forward(model, inputs, dtype=torch.float32):
    args = {k: (v.to(dtype) if v.is_floating_point() and not k.endswith("_ids") else v) for k, v in inputs.items()}
    with torch.no_grad():
        return model(**args, return_dict=False)[0].float()


class Work(parity.Work):
    """A FLUX.2 model saved in a temporary folder with its inputs and diffusers' output."""

    def __init__(self, name, cfg, seed, grid=(8, 8), txt=8, batched_int_ids=False, batch=1, dtype=torch.float32):
        super().__init__("tprun_flux2", name, cfg, seed, build_model,
                         lambda: make_inputs(cfg, grid, txt, seed, batched_int_ids, batch), diffusers_forward, dtype)
        p = cfg.get("patch_size", 1)
        out_ch = cfg.get("out_channels") or cfg["in_channels"]
        assert self.expected.shape == (batch, self.inputs["hidden_states"].shape[1], p * p * out_ch)


# ---------------------------------------------------------------------------------------------
# cases


def packed_blocks_of(module):
    return getattr(module, "_tp_packed_col_blocks", None) or getattr(module, "_tp_packed_row_blocks", None)


def style_name(style):
    if isinstance(style, str):
        return style
    return {"PackedColwiseParallel": "packed_colwise", "PackedRowwiseParallel": "packed_rowwise"}[type(style).__name__]


def proportions(blocks):
    g = 0
    for b in blocks:
        g = math.gcd(g, b)
    return [b // g for b in blocks]


def case_table():
    configs = [("klein_small", KLEIN_SMALL), ("odd", ODD), ("klein4b_width", KLEIN_4B_WIDTH)]
    for name, cfg in configs:
        model = build_model(cfg, 0, init=False)
        d = tempfile.mkdtemp(prefix=f"tprun_flux2_table_{name}_")
        try:
            # Shapes and names are all `inspect` reads: bf16 halves the bytes written at full width.
            (model.to(torch.bfloat16) if cfg.get("attention_head_dim", 128) >= 128 else model).save_pretrained(d)
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
                module, _leaf = tname.rsplit(".", 1)
                key, style = parity.plan_entry(Flux2Transformer2DModel._tp_plan, module)
                expected = "replicated" if style is None else style_name(style)
                t = ours[tname]
                if t["shape"] != shape or t["plan"] != expected or (key and t.get("plan_key") != key):
                    bad += 1
                    check(False, f"table {name}: {tname}: tprun {t['shape']} {t['plan']} {t.get('plan_key')}, "
                                 f"diffusers {shape} {expected} {key}")
            # The packed blocks of the plan against diffusers' own block structure.
            plan = {e["pattern"]: e for e in comp.get("tp_plan", [])}
            inner = model.config.num_attention_heads * model.config.attention_head_dim
            for key, style in Flux2Transformer2DModel._tp_plan.items():
                if not isinstance(style, str) and (model.config.num_layers if key.startswith("transformer_")
                                                   else model.config.num_single_layers) == 0:
                    continue
                if isinstance(style, str):
                    continue
                e = plan.get(key)
                if not check(e is not None and e["style"] == style_name(style),
                             f"table {name}: plan entry {key}: {e}"):
                    bad += 1
                    continue
                module = model.get_submodule(key.replace("*", "0"))
                if style.blocks is not None:  # PackedColwiseParallel([1, 1]): proportions
                    ok = proportions(e["blocks"]) == proportions(list(style.blocks)) and sum(e["blocks"]) == \
                        module.weight.shape[0]
                    ref = f"proportions {list(style.blocks)} of {module.weight.shape[0]}"
                else:  # the _tp_packed_*_blocks attribute on the Linear
                    ok = e["blocks"] == list(packed_blocks_of(module))
                    ref = f"{list(packed_blocks_of(module))} from the Linear"
                if not check(ok, f"table {name}: {key} blocks {e['blocks']} vs diffusers {ref}"):
                    bad += 1
            mlp = int(inner * model.config.mlp_ratio)
            check(comp["tp"]["valid"], f"table {name}: tp 2 valid ({comp['tp'].get('error', '')})")
            check(bad == 0, f"table {name}: {len(theirs)} tensors, names/shapes/plan/plan_key/blocks "
                            f"(inner {inner}, mlp {mlp}) match diffusers")
            # The same table from a config.json that leaves out every field equal to
            # diffusers' __init__ default (tprun's defaults must be diffusers').
            parity.check_defaults_stripped(name, d, Flux2Transformer2DModel, comp["tensors"])
        finally:
            shutil.rmtree(d, ignore_errors=True)
        del model


def case_forward():
    cases = [("klein_small", KLEIN_SMALL, dict(grid=(8, 8), txt=8), (1, 2, 4)),
             ("odd", ODD, dict(grid=(4, 6), txt=5, batched_int_ids=True, batch=2), (1, 2))]  # 6 heads: tp 4 does not divide
    for i, (name, cfg, shape, tps) in enumerate(cases):
        w = Work(name, cfg, seed=10 + i, **shape)
        try:
            for tp in tps:
                sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
                compare(f"forward {name} tp {tp}", sample, w.expected, SMALL_TOL, err)
            # The modulations sharded (rowwise_split_input) give the same output.
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out("shardmod"), 2,
                                        extra=("--shard-modulation",))
            compare(f"forward {name} tp 2 --shard-modulation", sample, w.expected, SMALL_TOL, err)
        finally:
            w.close()


def case_wide():
    t0 = time.time()
    w = Work("klein4b_width", KLEIN_4B_WIDTH, seed=20, grid=(4, 4), txt=8)
    del w.model
    try:
        tol = WIDE_REL_TOL * w.expected.abs().max().item()
        print(f"  built and ran diffusers in {time.time() - t0:.1f}s", flush=True)
        for tp in (1, 2):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp, timeout=400)
            compare(f"wide klein-4B width tp {tp}", sample, w.expected, tol, err)
    finally:
        w.close()


def case_bf16():
    w = Work("bf16", BF16_CONFIG, seed=30, dtype=torch.bfloat16)
    try:
        for tp in (1, 2, 4):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp, dtype="bf16")
            compare(f"bf16 tp {tp}", sample, w.expected, BF16_TOL, err)
    finally:
        w.close()


def packed_targets(cfg):
    """(tensor, split dim, absolute blocks) of every packed tensor of block 0, from diffusers' modules."""
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    mlp = int(inner * cfg["mlp_ratio"])
    return [("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", 0, [inner] * 3 + [mlp] * 2),
            ("transformer_blocks.0.ff.linear_in.weight", 0, [mlp, mlp]),
            ("transformer_blocks.0.ff_context.linear_in.weight", 0, [mlp, mlp]),
            ("single_transformer_blocks.0.attn.to_out.weight", 1, [inner, mlp])]


def plain_split_emulation(weight, dim, blocks, tp):
    """`weight` reordered along `dim` so that each rank's PACKED slice of the result is its PLAIN
    (contiguous 1/tp) slice of `weight`: tprun on it computes what a plain split would."""
    n = weight.shape[dim]
    out = torch.empty_like(weight)
    for r in range(tp):
        packed, off = [], 0
        for size in blocks:
            packed.append(torch.arange(off + r * size // tp, off + (r + 1) * size // tp))
            off += size
        plain = torch.arange(r * n // tp, (r + 1) * n // tp)
        out.index_copy_(dim, torch.cat(packed), weight.index_select(dim, plain))
    return out


def case_packed():
    cfg = PACKED_CONFIG
    w = Work("packed", cfg, seed=40)
    try:
        # The block structure used here is diffusers' own.
        m = w.model
        assert packed_blocks_of(m.single_transformer_blocks[0].attn.to_qkv_mlp_proj) == packed_targets(cfg)[0][2]
        assert packed_blocks_of(m.single_transformer_blocks[0].attn.to_out) == packed_targets(cfg)[3][2]
        base_state = load_file(os.path.join(w.model_dir, "diffusion_pytorch_model.safetensors"))
        pdir = os.path.join(w.dir, "perturbed")
        shutil.copytree(w.model_dir, pdir)
        g = torch.Generator().manual_seed(41)

        def run_with(tensor, value):
            state = dict(base_state)
            state[tensor] = value
            save_file(state, os.path.join(pdir, "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
            return state, tprun_forward(pdir, w.inputs_path, w.out("perturbed"), 2)

        for tensor, dim, blocks in packed_targets(cfg):
            # Negative control: reorder the tensor so that tprun's packed slices are what a plain
            # split of the original would hand each rank; that run must disagree with diffusers.
            _, (sample, err) = run_with(tensor, plain_split_emulation(base_state[tensor], dim, blocks, 2))
            dmax = float("nan") if err else (sample - w.expected).abs().max().item()
            check(err is None and dmax > PACKED_MIN_EFFECT,
                  f"packed {tensor}: a plain split instead would fail this check (max abs diff {dmax:.3g} vs "
                  f"diffusers) {err or ''}")
            start = 0
            for j, size in enumerate(blocks):
                # Rank 1 of tp 2 holds [start + size/2, start + size) of block j (packed split).
                lo, hi = start + size // 2, start + size
                start += size
                t = base_state[tensor].clone()
                sl = t.narrow(dim, lo, hi - lo)
                sl.add_(torch.randn(sl.shape, generator=g) * 0.5)
                state, (sample, err) = run_with(tensor, t)
                m.load_state_dict(state)
                expected = diffusers_forward(m, w.inputs)
                moved = (expected - w.expected).abs().max().item()
                label = f"packed {tensor} block {j}, {'rows' if dim == 0 else 'columns'} [{lo}, {hi}) (rank 1's)"
                if check(moved > PACKED_MIN_EFFECT, f"{label}: moves diffusers' output by {moved:.3g}"):
                    compare(f"{label}: tprun tp 2", sample, expected, SMALL_TOL, err)
    finally:
        w.close()


def case_allreduce():
    cfg = KLEIN_SMALL
    w = Work("allreduce", cfg, seed=50)
    try:
        parity.check_allreduce_count(w.model_dir, 2 * cfg["num_layers"] + cfg["num_single_layers"],
                                     f"2 * {cfg['num_layers']} + {cfg['num_single_layers']}")
    finally:
        w.close()


def case_validation():
    base = tempfile.mkdtemp(prefix="tprun_flux2_validation_")
    try:
        def saved(name, cfg, seed):
            d = os.path.join(base, name)
            build_model(cfg, seed).save_pretrained(d)
            ins = os.path.join(base, f"{name}_inputs.safetensors")
            save_file(make_inputs(cfg, (4, 4), 4, seed), ins)
            return d, ins

        def forward_args(d, ins, tp):
            return ["forward", "--model", d, "--inputs", ins, "--out", os.path.join(base, "never.safetensors"),
                    "--tp", str(tp)]

        small = dict(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=6, in_channels=8,
                     joint_attention_dim=12, axes_dims_rope=(2, 2, 2, 2), guidance_embeds=False)
        d, ins = saved("heads6", small, 60)
        expect_refusal("validation tp 4 vs 6 heads", 4, forward_args(d, ins, 4),
                       ["tp 4 does not divide num_attention_heads 6"])
        # mlp hidden int(32 * 3.03125) = 97: heads divide by 2, the packed gate/up blocks do not.
        odd_mlp = dict(small, num_attention_heads=4, mlp_ratio=3.03125)
        d, ins = saved("mlp97", odd_mlp, 61)
        expect_refusal("validation ff.linear_in block 97 at tp 2", 2, forward_args(d, ins, 2),
                       ["transformer_blocks.0.ff.linear_in.weight", "packed block", "97"])
        d, ins = saved("mlp97_single", dict(odd_mlp, num_layers=0), 62)
        expect_refusal("validation to_qkv_mlp_proj block 97 at tp 2", 2, forward_args(d, ins, 2),
                       ["single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", "packed block", "97"])
        # A tensor of the wrong shape, rewritten with safetensors' API.
        d, ins = saved("wrong_shape", small, 63)
        parity.expect_wrong_shape_refused(d, forward_args(d, ins, 2),
                                          "single_transformer_blocks.0.attn.to_out.weight")
    finally:
        shutil.rmtree(base, ignore_errors=True)


CASES = {"table": case_table, "forward": case_forward, "wide": case_wide, "bf16": case_bf16,
         "packed": case_packed, "allreduce": case_allreduce, "validation": case_validation}


if __name__ == "__main__":
    sys.exit(parity.main(CASES))
