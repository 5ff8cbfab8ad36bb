#!/usr/bin/env python3
"""Parity of tprun's Wan transformer (WanTransformer3DModel) with the real diffusers class.

Every model is diffusers' own class, built at test time with EVERY parameter redrawn from a
seeded generator (matrices ~ N(0, clamp(1/sqrt(fan_in), 0.02, 0.2)), biases ~ N(0, 0.05), the
1-d norm weights ~ N(1, 0.1), the scale_shift_tables ~ N(0, 0.1): diffusers' default init leaves
every RMSNorm / LayerNorm weight at 1 and would hide a swapped, unsharded or missing norm),
saved with save_pretrained. Inputs as WanPipeline passes them: the latent video
[B, C, F, H, W], the raw scheduler timestep (0 .. 1000, int64 as UniPC gives it) and the prompt
embeddings [B, S_txt, text_dim].

Cases (`wan_transformer_parity.py TPRUN MPIRUN [CASE ...]`, all when none given):
  table       `tprun inspect --json --tp 2` against state_dict: the same names in the same order
              (table_index), shapes, and tprun's plan (q/k/v, norm_q/norm_k, ffn.net.0.proj
              colwise; to_out.0, ffn.net.2 rowwise, their biases whole; the rest replicated) with
              its plan keys; the same table from a config.json without its default-valued fields.
  forward     fp32, max abs diff <= 1e-4 against diffusers: SMALL (4 heads x 12: RoPE parts 4 / 4 /
              4; 2 layers; 3 latent frames of a 4 x 6 grid; 7 text tokens; batch 2) at tp 1, 2, 4;
              tp 2 with --shard-modulation and with the queries in chunks; ODD (3 heads x 10,
              patch (2, 1, 2), cross_attn_norm false, an odd freq_dim, qk_norm null) at tp 1 and 3;
              the norm weights shown to matter (a model with norm_q set to 1 differs).
  wide        one layer at Wan2.1-T2V-1.3B's width (12 heads x 128: RoPE parts 44 / 42 / 42, ffn
              8960, text_dim 4096) at tp 1 and 2, held to WIDE_REL_TOL x max|sample|.
  allreduce   `tprun verify --tp 2` prints "all_reduce calls per forward: N (plan: M)" with
              N == M == 5 * num_layers (+1 with --shard-modulation).
  validation  refused on every rank with a non-zero exit: tp 3 with 4 heads (the plan check,
              before any weight byte); image_dim, added_kv_proj_dim, pos_embed_seq_len by name; a
              checkpoint tensor of the wrong shape; inputs: H not a multiple of the patch, the wrong
              text_dim, a [B, S] timestep, a missing encoder_hidden_states.
  bf16        diffusers as from_pretrained(torch_dtype=bfloat16) loads it (its
              _keep_in_fp32_modules stay fp32) against `tprun forward --dtype bf16` at tp 1, 2,
              held to BF16_TOL; fp8 layerwise casting (fp32 compute) against diffusers'
              enable_layerwise_casting: the same output (EXACT_TOL), the same number of tensors cast
              (the time embedder, patch embedding, norms and scale_shift_tables stay full
              precision), at tp 1 and 2.
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_parity as parity  # noqa: E402  (shared runs and checks)
from transformer_parity import check, compare, expect_refusal, mpirun, tprun_forward, tprun_inspect  # noqa: E402

SMALL_TOL = 1e-4
# fp8 storage with fp32 compute: the same cast weights, the same fp32 arithmetic as diffusers' hooks.
EXACT_TOL = 1e-4
# bf16, a loose check: measured on SMALL (seed 30, max|sample| 3.5) 0.023 at tp 1 and 2 (1.5 bf16
# ulp at [2, 4)); diffusers' own bf16 vs fp32 is 0.027 .. 0.033 over seeds 30..32. The bound (~2.5x)
# catches gross errors (a wrong scale, a block or norm missing) but NOT a single module's dtype slip:
# the whole diffusers model in bf16 (its fp32-kept modules included) differs from the kept-fp32 one
# by only 0.031 .. 0.035 here. The fp32-kept modules are held to diffusers by the table (tprun
# keeps them fp32 by declaration) and the fp8 check below (they are never cast).
BF16_TOL = 0.06
NORM_MIN_EFFECT = 1e-3
# Wide (Wan2.1-T2V-1.3B's width: 12 heads x 128, so the RoPE parts are the real 44 / 42 / 42): the
# 1536..8960-wide fp32 sums round in an order that differs between TP slices and kernels; held to
# WIDE_REL_TOL x max|sample|. Measured (seed 20, 2 x 3 x 4 grid, 9 text tokens): 1.7e-6 at tp 1,
# 1.4e-6 at tp 2 with max|sample| 3.9 (4e-7 of it): the bound (1.9e-4 here) leaves > 100x.
WIDE_REL_TOL = 5e-5

SMALL = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=6, out_channels=5,
             text_dim=20, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True, eps=1e-6,
             rope_max_seq_len=64)
WIDE = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
            text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=1, cross_attn_norm=True, eps=1e-6)
ODD = dict(patch_size=(2, 1, 2), num_attention_heads=3, attention_head_dim=10, in_channels=5, out_channels=3,
           text_dim=11, freq_dim=15, ffn_dim=36, num_layers=1, cross_attn_norm=False, qk_norm=None, eps=1e-5,
           rope_max_seq_len=32)


def build_model(cfg, seed):
    """diffusers' class on the CPU (its RoPE buffers made by __init__) with every parameter redrawn."""
    model = WanTransformer3DModel(**cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif p.ndim >= 2:
                fan_in = p[0].numel()
                std = min(max(1.0 / fan_in ** 0.5, 0.02), 0.2)
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            else:
                assert "norm" in name, name
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def make_inputs(cfg, frames, height, width, txt, seed, batch=2):
    """frames / height / width in patches."""
    g = torch.Generator().manual_seed(seed + 1000)
    pt, ph, pw = cfg["patch_size"]
    return {
        "hidden_states": torch.randn(batch, cfg["in_channels"], frames * pt, height * ph, width * pw, generator=g),
        "timestep": torch.tensor([999, 313, 500][:batch], dtype=torch.int64),
        "encoder_hidden_states": torch.randn(batch, txt, cfg["text_dim"], generator=g),
    }


def diffusers_forward(model, inputs, dtype=torch.float32):
    args = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    with torch.no_grad():
        return model(**args, return_dict=False)[0].float()


class Work(parity.Work):
    def __init__(self, name, cfg, seed, grid=(3, 4, 6), txt=7, batch=2):
        super().__init__("tprun_wan", name, cfg, seed, build_model,
                         lambda: make_inputs(cfg, *grid, txt, seed, batch), diffusers_forward)
        assert self.expected.shape == self.inputs["hidden_states"].shape[:1] + (cfg["out_channels"],) + \
            self.inputs["hidden_states"].shape[2:]


# ---------------------------------------------------------------------------------------------
# the plan tprun gives the class (diffusers has none)

COLWISE = re.compile(r"blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|norm_q|norm_k)|ffn\.net\.0\.proj)\.(weight|bias)")
ROWWISE = re.compile(r"blocks\.\d+\.(attn[12]\.to_out\.0|ffn\.net\.2)\.weight")


def expected_plan(name):
    """(style, plan_key) of a tensor under tprun's plan; rowwise biases are whole (added after the
    reduce) but carry their module's key."""
    module = name.rsplit(".", 1)[0]
    key = re.sub(r"^blocks\.\d+\.", "blocks.*.", module)
    if COLWISE.fullmatch(name):
        return "colwise", key
    if ROWWISE.fullmatch(name):
        return "rowwise", key
    if re.fullmatch(r"blocks\.\d+\.(attn[12]\.to_out\.0|ffn\.net\.2)\.bias", name):
        return "replicated", key
    return "replicated", None


def case_table():
    for name, cfg in (("small", SMALL), ("odd", ODD)):
        model = build_model(cfg, 0)
        d = tempfile.mkdtemp(prefix=f"tprun_wan_table_{name}_")
        try:
            model.save_pretrained(d)
            r = tprun_inspect(d) if name == "small" else \
                subprocess.run([parity.STATE.tprun, "inspect", d, "--json", "--tp", "3"], capture_output=True,
                               text=True, timeout=120)
            if not check(r.returncode == 0, f"table {name}: tprun inspect exit {r.returncode} {r.stderr[-500:]}"):
                continue
            comp = json.loads(r.stdout)["components"][0]
            ours = {t["name"]: t for t in comp["tensors"]}
            theirs = [(k, list(v.shape)) for k, v in model.state_dict().items()]
            check(set(ours) == {k for k, _ in theirs},
                  f"table {name}: names (only tprun {sorted(set(ours) - {k for k, _ in theirs})[:4]}, "
                  f"only diffusers {sorted({k for k, _ in theirs} - set(ours))[:4]})")
            order = sorted(ours, key=lambda n: ours[n].get("table_index", -1))
            check(order == [k for k, _ in theirs], f"table {name}: declared in state_dict order")
            bad = 0
            for tname, shape in theirs:
                t = ours.get(tname)
                if t is None:
                    continue
                style, key = expected_plan(tname)
                if t["shape"] != shape or t["plan"] != style or t.get("plan_key") != key:
                    bad += 1
                    check(False, f"table {name}: {tname}: tprun {t['shape']} {t['plan']} {t.get('plan_key')}, "
                                 f"expected {shape} {style} {key}")
            split = sum(1 for t in ours.values() if t["plan"] != "replicated")
            check(comp["tp"]["valid"], f"table {name}: tp {2 if name == 'small' else 3} valid "
                                       f"({comp['tp'].get('error', '')})")
            check(bad == 0, f"table {name}: {len(theirs)} tensors ({split} split), names / shapes / plan "
                            f"/ plan keys as expected")
            if name == "small":  # (inspect at tp 2, which ODD's 3 heads refuse)
                parity.check_defaults_stripped(name, d, WanTransformer3DModel, comp["tensors"])
        finally:
            shutil.rmtree(d, ignore_errors=True)


def case_forward():
    w = Work("small", SMALL, seed=10)
    try:
        # The across-heads norm weights matter (so a norm left unsharded or unloaded cannot pass).
        ones = build_model(SMALL, 0)
        ones.load_state_dict(w.model.state_dict())
        with torch.no_grad():
            ones.blocks[0].attn1.norm_q.weight.fill_(1.0)
        effect = (diffusers_forward(ones, w.inputs) - w.expected).abs().max().item()
        check(effect > NORM_MIN_EFFECT, f"forward small: norm_q's weight changes diffusers' output by {effect:.3g}")
        for tp in (1, 2, 4):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
            compare(f"forward small tp {tp}", sample, w.expected, SMALL_TOL, err)
        for label, extra in (("--shard-modulation", ("--shard-modulation",)),
                             ("attention_chunk=7", ("--memory", "attention_chunk=7"))):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(label[:5]), 2, extra=extra)
            compare(f"forward small tp 2 {label}", sample, w.expected, SMALL_TOL, err)
        # A float timestep (FlowMatchEulerDiscrete's) and one value for the batch.
        inputs = dict(w.inputs, timestep=torch.tensor([637.25]))
        expected = diffusers_forward(w.model, dict(inputs, timestep=inputs["timestep"].expand(2)))
        sample, err = tprun_forward(w.model_dir, w.save_inputs("float_t", inputs), w.out("float_t"), 2)
        compare("forward small tp 2, one float timestep for the batch", sample, expected, SMALL_TOL, err)
    finally:
        w.close()
    w = Work("odd", ODD, seed=11, grid=(2, 3, 5), txt=5, batch=2)
    try:
        for tp in (1, 3):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
            compare(f"forward odd (3 heads, patch (2, 1, 2), no cross_attn_norm) tp {tp}", sample, w.expected,
                    SMALL_TOL, err)
    finally:
        w.close()


def case_wide():
    w = Work("wide", WIDE, seed=20, grid=(2, 3, 4), txt=9, batch=1)
    try:
        tol = WIDE_REL_TOL * w.expected.abs().max().item()
        for tp in (1, 2):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
            compare(f"wide (12 heads x 128, ffn 8960, text_dim 4096) tp {tp}", sample, w.expected, tol, err)
    finally:
        w.close()


def case_allreduce():
    w = Work("allreduce", SMALL, seed=50)
    try:
        parity.check_allreduce_count(w.model_dir, 5 * SMALL["num_layers"], f"5 * {SMALL['num_layers']}")
    finally:
        w.close()


def case_validation():
    base = tempfile.mkdtemp(prefix="tprun_wan_validation_")
    try:
        cfg = dict(SMALL, num_layers=1)
        d = os.path.join(base, "model")
        build_model(cfg, 60).save_pretrained(d)
        ins = os.path.join(base, "inputs.safetensors")
        save_file(make_inputs(cfg, 1, 2, 2, 3, 60), ins)
        never = os.path.join(base, "never.safetensors")

        def forward_args(folder, inputs, tp):
            return ["forward", "--model", folder, "--inputs", inputs, "--out", never, "--tp", str(tp)]

        expect_refusal("validation tp 3 vs 4 heads", 3, forward_args(d, ins, 3),
                       ["tp 3 does not divide num_attention_heads 4"])
        good = load_file(ins)
        for label, change, words in (
                ("H not a multiple of the patch",
                 lambda t: t.update(hidden_states=torch.randn(2, 6, 1, 5, 4)),
                 ["input 'hidden_states'", "multiples of patch_size (1, 2, 2)", "[2, 6, 1, 5, 4]"]),
                ("wrong text_dim", lambda t: t.update(encoder_hidden_states=torch.randn(2, 3, 7)),
                 ["input 'encoder_hidden_states' has 7 features per token but text_dim is 20"]),
                ("per-token timestep", lambda t: t.update(timestep=torch.ones(2, 4)),
                 ["input 'timestep' must be [2] or one value"]),
                ("missing encoder_hidden_states", lambda t: t.pop("encoder_hidden_states"),
                 ["input 'encoder_hidden_states' is missing"])):
            bad_inputs = dict(good)
            change(bad_inputs)
            path = os.path.join(base, "bad_inputs.safetensors")
            save_file(bad_inputs, path)
            expect_refusal(f"inputs {label}", 2, forward_args(d, path, 2), words)
        for field, value in (("image_dim", 1280), ("added_kv_proj_dim", 5120), ("pos_embed_seq_len", 514)):
            v = os.path.join(base, field)
            shutil.copytree(d, v)
            cfg_path = os.path.join(v, "config.json")
            c = json.load(open(cfg_path))
            c[field] = value
            json.dump(c, open(cfg_path, "w"))
            expect_refusal(f"validation {field}", 2, forward_args(v, ins, 2), [f"'{field}'", "not supported"])
        parity.expect_wrong_shape_refused(d, forward_args(d, ins, 2), "blocks.0.ffn.net.2.weight")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def cast_modules(model):
    """The modules diffusers' enable_layerwise_casting hooked."""
    return sorted(n for n, m in model.named_modules() if getattr(m, "_diffusers_hook", None) is not None
                  and m._diffusers_hook.get_hook("layerwise_casting"))


def from_pretrained_16bit(model, dtype):
    """`model` as diffusers' from_pretrained(torch_dtype=dtype) loads it (which needs accelerate for
    this class, absent here): each parameter in `dtype` except those under a module named in
    _keep_in_fp32_modules (load_model_dict_into_meta's test: the name split at dots), kept fp32; the
    RoPE buffers, made by __init__, stay fp32."""
    keep = WanTransformer3DModel._keep_in_fp32_modules
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(m in name.split(".") for m in keep):
                p.data = p.data.to(dtype)
    return model


def case_bf16():
    w = Work("bf16", SMALL, seed=30)
    try:
        model = from_pretrained_16bit(copy.deepcopy(w.model), torch.bfloat16)
        kept = sorted(n for n, p in model.named_parameters() if p.dtype == torch.float32)
        check(any("time_embedder" in n for n in kept) and any("norm2" in n for n in kept),
              f"bf16: diffusers keeps {len(kept)} parameters in fp32 (time_embedder, scale_shift_tables, norm2)")
        expected = diffusers_forward(model, w.inputs, torch.bfloat16)
        for tp in (1, 2):
            sample, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"bf16_tp{tp}"), tp, dtype="bf16")
            compare(f"bf16 tp {tp}", sample, expected, BF16_TOL, err)
        # fp8 storage, fp32 compute: exactly diffusers' enable_layerwise_casting.
        for storage in ("float8_e4m3fn",):
            cast = build_model(SMALL, 0)
            cast.load_state_dict(w.model.state_dict())
            cast.enable_layerwise_casting(storage_dtype=getattr(torch, storage), compute_dtype=torch.float32)
            want = diffusers_forward(cast, w.inputs)
            mods = cast_modules(cast)
            check(mods and not any(("norm" in m or "condition_embedder" in m or "patch_embedding" in m) for m in mods),
                  f"fp8: diffusers casts {len(mods)} modules, none of the embedders / norms")
            spread = (want - w.expected).abs().max().item()
            check(spread > NORM_MIN_EFFECT, f"fp8: diffusers' cast model differs from the plain one by {spread:.3g}")
            n_params = sum(len(list(dict(cast.named_modules())[n].parameters())) for n in mods)
            for tp in (1, 2):
                rc, log = mpirun(tp, "forward", "--model", w.model_dir, "--inputs", w.inputs_path, "--out",
                                 w.out(f"fp8_tp{tp}"), "--tp", str(tp), "--memory",
                                 f'layerwise_casting={{storage="{storage}"}}')
                if not check(rc == 0, f"fp8 tp {tp}: forward ran{'' if rc == 0 else ': ' + (log or '')[-1500:]}"):
                    continue
                got = load_file(w.out(f"fp8_tp{tp}"))["sample"]
                compare(f"fp8 {storage} tp {tp} vs diffusers enable_layerwise_casting (cast vs plain "
                        f"{spread:.3g})", got, want, EXACT_TOL, None)
                m = re.search(r"(\d+) tensors \(Linear / Conv / Embedding weights and biases\) stored in " + storage,
                              log)
                check(m is not None and int(m.group(1)) == n_params,
                      f"fp8 tp {tp}: tprun casts {m.group(1) if m else '?'} tensors, diffusers {n_params}")
    finally:
        w.close()


CASES = {"table": case_table, "forward": case_forward, "wide": case_wide, "allreduce": case_allreduce, "validation": case_validation,
         "bf16": case_bf16}


if __name__ == "__main__":
    sys.exit(parity.main(CASES))
