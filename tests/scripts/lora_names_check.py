#!/usr/bin/env python3
"""Cross-checks tprun's adapter name maps (src/models/*_lora_names.cpp) against diffusers' converters.

For a few synthetic kohya / BFL / Wan / Qwen state dicts on tiny configs, runs diffusers' own converter
(diffusers.loaders.lora_conversion_utils) and reads back, by matching tensors, which module each
converted lora_B comes from (the rows of which file key, halves swapped or not), which file key its
lora_A is, and the factor alpha / rank folded in. Writes that as tests/data/lora/names_expected.json,
which tests/unit/test_lora_file_map.cpp maps with tprun and compares part by part.

    ~/.cache/tprun/venv/bin/python tests/scripts/lora_names_check.py [--check]

--check: compare with the committed JSON instead of writing it (exit 1 on a difference).

The cases leave out what tprun deliberately does differently from diffusers 0.40 (each said in
src/models/*_lora_names.cpp or src/lora/lora_file_map.h):
- FLUX.1 kohya final_layer alphas: diffusers' converter drops them unread; tprun folds alpha / rank in.
- FLUX.2 final_layer.adaLN_modulation.1: diffusers maps it to norm_out.linear unswapped, although its
  checkpoint converter swaps the base weight's (shift, scale) halves; tprun swaps B's halves
  (unit test LoraFileMap.Flux2FinalLayerSwappedAsItsBaseWeights).
- FLUX.1 kohya img_in / txt_in / time_in / vector_in / guidance_in / final_layer: diffusers' converter
  writes them without the "transformer." prefix, so load_lora_weights then drops them silently; the
  converter's mapping is what this script compares, and tprun applies them.
"""
import argparse
import json
import pathlib
import sys

import torch
from diffusers.loaders import lora_conversion_utils as conv

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "lora" / "names_expected.json"

FLUX1 = {"_class_name": "FluxTransformer2DModel", "num_attention_heads": 24, "attention_head_dim": 128,
         "num_layers": 2, "num_single_layers": 2, "in_channels": 16, "out_channels": None, "patch_size": 1,
         "joint_attention_dim": 24, "pooled_projection_dim": 12, "guidance_embeds": True,
         "axes_dims_rope": [16, 56, 56]}
FLUX2 = {"_class_name": "Flux2Transformer2DModel", "num_attention_heads": 2, "attention_head_dim": 8,
         "axes_dims_rope": [2, 2, 2, 2], "num_layers": 2, "num_single_layers": 2, "in_channels": 8,
         "joint_attention_dim": 24, "timestep_guidance_channels": 32, "mlp_ratio": 2.0, "guidance_embeds": True}
WAN = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 2,
       "attention_head_dim": 8, "in_channels": 4, "out_channels": 4, "text_dim": 20, "freq_dim": 32,
       "ffn_dim": 32, "num_layers": 2}
QWEN = {"_class_name": "QwenImageTransformer2DModel", "num_attention_heads": 2, "attention_head_dim": 16,
        "num_layers": 2, "in_channels": 16, "out_channels": 4, "patch_size": 2, "joint_attention_dim": 24,
        "axes_dims_rope": [4, 6, 6]}

gen = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


class Builder:
    """A synthetic state dict: pairs with distinct random values, optional alphas."""

    def __init__(self):
        self.sd = {}
        self.alphas = {}

    def pair(self, stem, down_suffix, up_suffix, rank, inp, out, alpha=None):
        self.sd[stem + down_suffix] = rand(rank, inp)
        self.sd[stem + up_suffix] = rand(out, rank)
        if alpha is not None:
            self.sd[stem + ".alpha"] = torch.tensor(float(alpha), dtype=torch.float64)
            self.alphas[stem + ".alpha"] = float(alpha)

    def kohya(self, stem, rank, inp, out, alpha=None):
        self.pair(stem, ".lora_down.weight", ".lora_up.weight", rank, inp, out, alpha)

    def peft(self, stem, rank, inp, out, alpha=None):
        self.pair(stem, ".lora_A.weight", ".lora_B.weight", rank, inp, out, alpha)


def fresh(sd):
    """A copy of the state dict with its own tensors: some converters scale in place (`*=`)."""
    return {k: v.clone() for k, v in sd.items()}


def derive(source, converted):
    """Expected parts: for every converted module, the source keys, B rows and the folded scale."""
    downs = {k: v for k, v in source.items() if k.endswith((".lora_down.weight", ".lora_A.weight"))}
    ups = {k: v for k, v in source.items() if k.endswith((".lora_up.weight", ".lora_B.weight"))}
    parts = []
    for key in sorted(converted):
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")].removeprefix("transformer.")
        a = converted[key].double()
        b = converted[key.replace(".lora_A.", ".lora_B.")].double()
        down_key = next(k for k, v in downs.items()
                        if v.shape == a.shape and torch.allclose(a / a.flatten()[0] * v.flatten()[0], v))
        scale_a = (a.flatten()[0] / downs[down_key].flatten()[0]).item()
        found = None
        n = b.shape[0]
        b0 = b[0] / b[0].norm()
        for up_key, up in ups.items():
            if up.shape[1] != b.shape[1]:
                continue
            cos = (up / up.norm(dim=1, keepdim=True)) @ b0
            for c in torch.nonzero((cos.abs() - 1).abs() < 1e-9).flatten().tolist():
                for offset, swapped in ((c, False), (c - n // 2, True)):
                    if offset < 0 or offset + n > up.shape[0] or (swapped and n % 2):
                        continue
                    rows = up[offset:offset + n]
                    if swapped:
                        rows = torch.cat([rows[n // 2:], rows[: n // 2]])
                    ratio = b.flatten()[0] / rows.flatten()[0]
                    if torch.allclose(b, rows * ratio):
                        found = (up_key, offset, n, swapped, ratio.item())
                        break
                if found:
                    break
            if found:
                break
        assert found, f"no source rows for {key}"
        up_key, offset, n, swapped, scale_b = found
        parts.append({"module": module, "down_key": down_key, "up_key": up_key, "up_row_offset": offset,
                      "up_rows": n, "up_halves_swapped": swapped, "rank": a.shape[0],
                      "alpha_scale": round(scale_a * scale_b, 12)})
    return parts


def case(name, config, builder, converted):
    tensors = []
    for k, v in sorted(builder.sd.items()):
        entry = {"key": k, "shape": list(v.shape)}
        if k in builder.alphas:
            entry["alpha"] = builder.alphas[k]
        tensors.append(entry)
    return {"name": name, "config": config, "tensors": tensors, "expected": derive(builder.sd, converted)}


def flux1_kohya():
    # FLUX.1-dev's widths (inner 3072): diffusers' converter hard-codes them for linear1's split.
    inner, mlp = 3072, 4 * 3072
    b = Builder()
    b.kohya("lora_unet_double_blocks_0_img_attn_qkv", 4, inner, 3 * inner, alpha=2)
    b.kohya("lora_unet_double_blocks_1_txt_attn_qkv", 4, inner, 3 * inner)
    b.kohya("lora_unet_double_blocks_0_img_mod_lin", 2, inner, 6 * inner, alpha=8)
    b.kohya("lora_unet_double_blocks_1_txt_mlp_2", 3, 4 * inner, inner, alpha=1.5)
    b.kohya("lora_unet_single_blocks_1_linear1", 4, inner, 3 * inner + mlp, alpha=4)
    b.kohya("lora_unet_single_blocks_0_linear2", 2, inner + mlp, inner, alpha=1)
    b.kohya("lora_unet_single_blocks_0_modulation_lin", 2, inner, 3 * inner)
    # No alpha here: diffusers' converter drops final_layer alphas unread ("TODO: alphas"); tprun folds them in.
    b.kohya("lora_unet_final_layer_adaLN_modulation_1", 2, inner, 2 * inner)
    b.kohya("lora_unet_img_in", 2, 16, inner)
    converted = conv._convert_kohya_flux_lora_to_diffusers(fresh(b.sd))
    return case("flux1_kohya", FLUX1, b, converted)


def flux2_bfl():
    inner, mlp = 16, 32
    b = Builder()
    b.peft("diffusion_model.double_blocks.0.img_attn.qkv", 4, inner, 3 * inner)
    b.peft("diffusion_model.double_blocks.1.txt_attn.qkv", 2, inner, 3 * inner)
    b.peft("diffusion_model.double_blocks.0.img_mlp.0", 2, inner, 2 * mlp)
    b.peft("diffusion_model.double_blocks.0.txt_attn.proj", 2, inner, inner)
    b.peft("diffusion_model.single_blocks.1.linear1", 4, inner, 3 * inner + 2 * mlp)
    b.peft("diffusion_model.single_blocks.0.linear2", 2, inner + mlp, inner)
    b.peft("diffusion_model.double_stream_modulation_img.lin", 2, inner, 6 * inner)
    b.peft("diffusion_model.time_in.in_layer", 2, 32, inner)
    return case("flux2_bfl", FLUX2, b, conv._convert_non_diffusers_flux2_lora_to_diffusers(fresh(b.sd)))


def flux2_kohya():
    inner, mlp = 16, 32
    b = Builder()
    b.kohya("lora_unet_double_blocks_1_img_attn_qkv", 4, inner, 3 * inner, alpha=8)
    b.kohya("lora_unet_double_blocks_0_txt_mlp_2", 2, mlp, inner, alpha=1)
    b.kohya("lora_unet_single_blocks_0_linear1", 4, inner, 3 * inner + 2 * mlp, alpha=2)
    b.kohya("lora_unet_single_blocks_1_linear2", 2, inner + mlp, inner)
    b.kohya("lora_unet_txt_in", 2, 24, inner, alpha=4)
    return case("flux2_kohya", FLUX2, b, conv._convert_kohya_flux2_lora_to_diffusers(fresh(b.sd)))


def wan_original():
    inner, ffn = 16, 32
    b = Builder()
    b.peft("diffusion_model.blocks.0.self_attn.q", 2, inner, inner)
    b.peft("diffusion_model.blocks.0.cross_attn.o", 2, inner, inner)
    b.peft("diffusion_model.blocks.1.ffn.0", 4, inner, ffn)
    b.peft("diffusion_model.blocks.1.ffn.2", 4, ffn, inner)
    b.peft("diffusion_model.head.head", 2, inner, 4 * 4)
    return case("wan_original", WAN, b, conv._convert_non_diffusers_wan_lora_to_diffusers(fresh(b.sd)))


def wan_original_alpha():
    inner, ffn = 16, 32
    b = Builder()
    for i in range(2):
        b.pair(f"diffusion_model.blocks.{i}.self_attn.k", ".lora_down.weight", ".lora_up.weight", 4, inner, inner,
               alpha=2)
        b.pair(f"diffusion_model.blocks.{i}.ffn.2", ".lora_down.weight", ".lora_up.weight", 2, ffn, inner, alpha=8)
    return case("wan_original_alpha", WAN, b, conv._convert_non_diffusers_wan_lora_to_diffusers(fresh(b.sd)))


def wan_musubi():
    inner, ffn = 16, 32
    b = Builder()
    for o in ["self_attn_q", "self_attn_k", "self_attn_v", "self_attn_o",
              "cross_attn_q", "cross_attn_k", "cross_attn_v", "cross_attn_o"]:
        b.kohya(f"lora_unet_blocks_0_{o}", 2, inner, inner, alpha=1)
    b.kohya("lora_unet_blocks_0_ffn_0", 4, inner, ffn, alpha=8)
    b.kohya("lora_unet_blocks_0_ffn_2", 4, ffn, inner, alpha=2)
    return case("wan_musubi", WAN, b, conv._convert_musubi_wan_lora_to_diffusers(fresh(b.sd)))


def qwen_kohya():
    inner = 32
    b = Builder()
    b.kohya("lora_unet_transformer_blocks_0_attn_to_q", 4, inner, inner, alpha=2)
    b.kohya("lora_unet_transformer_blocks_1_attn_add_k_proj", 2, inner, inner, alpha=8)
    b.kohya("lora_unet_transformer_blocks_0_attn_to_add_out", 2, inner, inner, alpha=1)
    b.kohya("lora_unet_transformer_blocks_1_img_mod_1", 2, inner, 6 * inner, alpha=2)
    b.kohya("lora_unet_transformer_blocks_0_txt_mlp_net_2", 2, 4 * inner, inner, alpha=4)
    b.kohya("lora_unet_img_in", 2, 16, inner, alpha=2)
    return case("qwen_kohya", QWEN, b, conv._convert_non_diffusers_qwen_lora_to_diffusers(fresh(b.sd)))


def qwen_metadata():
    """diffusers-format keys with lora_adapter_metadata: each module's r and alpha as PEFT's own
    get_pattern_key picks them from rank_pattern / alpha_pattern (LoraModel._create_and_replace)."""
    from peft.utils.other import get_pattern_key
    inner = 32
    meta = {"r": 4, "lora_alpha": 6, "use_rslora": False,
            "rank_pattern": {"^transformer_blocks.1.attn.to_k": 2, "img_mod.1": 8},
            "alpha_pattern": {"attn.to_k": 3, "^transformer_blocks.0.attn.to_q": 16}}
    modules = {"transformer_blocks.0.attn.to_q": (inner, inner), "transformer_blocks.1.attn.to_q": (inner, inner),
               "transformer_blocks.0.attn.to_k": (inner, inner), "transformer_blocks.1.attn.to_k": (inner, inner),
               "transformer_blocks.1.img_mod.1": (inner, 6 * inner), "transformer_blocks.0.attn.add_k_proj": (inner, inner)}
    b = Builder()
    parts = []
    for name, (inp, out) in modules.items():
        r = meta["rank_pattern"].get(get_pattern_key(meta["rank_pattern"].keys(), name), meta["r"])
        alpha = meta["alpha_pattern"].get(get_pattern_key(meta["alpha_pattern"].keys(), name), meta["lora_alpha"])
        b.peft("transformer." + name, r, inp, out)
        parts.append({"module": name, "down_key": f"transformer.{name}.lora_A.weight",
                      "up_key": f"transformer.{name}.lora_B.weight", "up_row_offset": 0, "up_rows": out,
                      "up_halves_swapped": False, "rank": r, "alpha_scale": round(alpha / r, 12)})
    c = case("qwen_metadata", QWEN, b, {})
    c["expected"] = sorted(parts, key=lambda p: p["module"])
    c["metadata"] = json.dumps({f"transformer.{k}": v for k, v in meta.items()}, indent=2, sort_keys=True)
    return c


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    data = {"generated_by": "tests/scripts/lora_names_check.py",
            "cases": [flux1_kohya(), flux2_bfl(), flux2_kohya(), wan_original(), wan_original_alpha(), wan_musubi(),
                      qwen_kohya(), qwen_metadata()]}
    text = json.dumps(data, indent=1) + "\n"
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} differs from what diffusers' converters give now", file=sys.stderr)
            return 1
        print("ok")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}: {sum(len(c['expected']) for c in data['cases'])} parts in {len(data['cases'])} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
