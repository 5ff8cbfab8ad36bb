"""Random LoRA adapter files for the LoRA parity tests (lora_parity.py), in the formats diffusers'
`load_lora_weights` reads for each family, made from a diffusers transformer loaded from an `init-model` folder.

- "peft"*: an adapter peft injects (LoraConfig: r, lora_alpha, rank_pattern / alpha_pattern, use_rslora) into the
  transformer, every lora tensor redrawn, saved by the pipeline class's `save_lora_weights` with its
  `lora_adapter_metadata` (keys `transformer.<module>.lora_A.weight`).
- "prefixed": the keys of such an adapter under `diffusion_model.` or `base_model.model.` (ai-toolkit, ComfyUI,
  peft's own prefix), no metadata: alpha = r.
- "kohya" / "comfy" (FLUX.1): sd-scripts' `lora_unet_<BFL name>.lora_down / lora_up / alpha`, written here from the
  model's widths (a fused qkv and the single block's linear1 as one tensor each); "comfy" is the same under
  `diffusion_model.<BFL dotted name>`.
- "kohya_te" (FLUX.1): "kohya" with CLIP text-encoder keys (`lora_te1_text_model_encoder_layers_0_...`);
  "kohya_extra": "kohya" with keys of blocks the model does not have (what `--lora-strict false` skips);
  "kohya_top": "kohya" with the top-level linears (img_in, time_in, vector_in, guidance_in, final_layer).
- "bfl" / "kohya" (FLUX.2): ai-toolkit's `diffusion_model.<BFL name>.lora_A / lora_B` (fused qkv, linear1 / linear2,
  the modulation and embedder linears) and sd-scripts' `lora_unet_<BFL name>.lora_down / lora_up / alpha` (the
  top-level linears diffusers' converter reads).
- "kohya" (Qwen-Image): `lora_unet_transformer_blocks_0_attn_to_q.lora_down / lora_up / alpha`.
- "original" (Wan): `diffusion_model.blocks.0.self_attn.q.lora_down / lora_up / alpha` (LightX2V), the embedders
  and head without alpha (diffusers reads none there).

Every tensor is drawn from a generator seeded by the file's seed: A ~ N(0, 1/in) and B ~ N(0, B_STD^2 / r), so the
adapted output moves by about B_STD of the input's size: images change visibly and stay sane. Alphas differ from
the rank (and between modules) so that the scale of every format is exercised.
"""
import json
import os

import torch

B_STD = 0.2  # set per family by lora_parity.py (set_b_std): the tiny VAEs of Qwen-Image and Wan damp changes more


def set_b_std(value):
    global B_STD
    B_STD = value


def _draw(g, shape, std):
    return (torch.randn(shape, generator=g, dtype=torch.float32) * std).contiguous()


def _pair(g, rank, in_features, out_features):
    return _draw(g, (rank, in_features), in_features ** -0.5), _draw(g, (out_features, rank), B_STD / rank ** 0.5)


def linears(transformer):
    """{module name: (in, out)} of every nn.Linear of a diffusers transformer, in module order."""
    return {n: (m.in_features, m.out_features) for n, m in transformer.named_modules()
            if isinstance(m, torch.nn.Linear)}


def peft_adapter(transformer, seed, config):
    """The state dict (module keys, no prefix) of a LoRA peft injects with `config` (a peft.LoraConfig) into
    `transformer`, every lora_A / lora_B redrawn from `seed`; the adapter is removed again."""
    from peft.utils import get_peft_model_state_dict
    name = f"maker{seed}"
    transformer.add_adapter(config, adapter_name=name)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in sorted(transformer.named_parameters()):
            if f"lora_A.{name}" in pname:
                p.copy_(_draw(g, p.shape, p.shape[1] ** -0.5))
            elif f"lora_B.{name}" in pname:
                p.copy_(_draw(g, p.shape, B_STD / p.shape[1] ** 0.5))
    sd = get_peft_model_state_dict(transformer, adapter_name=name)
    sd = {k: v.detach().clone().contiguous() for k, v in sd.items()}
    transformer.delete_adapters(name)
    return sd


def save_peft(pipe_cls, path, sd, config):
    """`sd` saved as `pipe_cls.save_lora_weights` writes it, with the config as lora_adapter_metadata."""
    meta = config.to_dict()
    meta = {k: (sorted(v) if isinstance(v, set) else v) for k, v in meta.items()}
    pipe_cls.save_lora_weights(os.path.dirname(path), transformer_lora_layers=sd, weight_name=os.path.basename(path),
                               transformer_lora_adapter_metadata=meta)
    return path


def save_plain(path, sd):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


def lora_config(targets, r=4, alpha=2.0, **kw):
    from peft import LoraConfig
    return LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False, **kw)


# ---- the formats ---------------------------------------------------------------------------------------

def make_peft(ctx, path, seed, targets, **config_kw):
    """A diffusers/PEFT file with metadata (r, alpha, patterns, rslora as `config_kw` say)."""
    config = lora_config(targets, **config_kw)
    return save_peft(ctx["pipe_cls"], path, peft_adapter(ctx["transformer"], seed, config), config)


def make_prefixed(ctx, path, seed, targets, prefix, r=4):
    """The PEFT keys under `prefix` ("diffusion_model." / "base_model.model."), no metadata (alpha = r)."""
    sd = peft_adapter(ctx["transformer"], seed, lora_config(targets, r=r, alpha=r))
    return save_plain(path, {prefix + k: v for k, v in sd.items()})


def _write_original(path, seed, modules, key_fn, down="lora_down", up="lora_up", alphas=None):
    """modules: [(original name, in, out, rank)]; key_fn(name) -> the key stem; alphas(name, rank) -> alpha or None."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, in_f, out_f, rank in modules:
        a, b = _pair(g, rank, in_f, out_f)
        stem = key_fn(name)
        sd[f"{stem}.{down}.weight"], sd[f"{stem}.{up}.weight"] = a, b
        alpha = alphas(name, rank) if alphas else None
        if alpha is not None:
            sd[f"{stem}.alpha"] = torch.tensor(float(alpha))
    return save_plain(path, sd)


def flux1_bfl_modules(lin, cfg, rank=4):
    """FLUX.1's BFL block linears (name, in, out, rank) from the diffusers model's widths: a fused qkv is q+k+v's
    rows; single blocks' linear1 is q, k, v and proj_mlp's rows, linear2 proj_out. Only block modules: diffusers'
    kohya converter keeps the top-level ones (img_in, time_in, final_layer, ...) out of the transformer's keys."""
    mods = []
    for i in range(cfg["num_layers"]):
        p = f"transformer_blocks.{i}."
        inner = lin[p + "attn.to_q"][1]
        for s, q, o, ff, norm in (("img", "to_q", "to_out.0", "ff", "norm1"),
                                  ("txt", "add_q_proj", "to_add_out", "ff_context", "norm1_context")):
            mods += [(f"double_blocks.{i}.{s}_attn.qkv", lin[p + "attn." + q][0], 3 * inner, rank),
                     (f"double_blocks.{i}.{s}_attn.proj", *lin[p + "attn." + o], rank),
                     (f"double_blocks.{i}.{s}_mlp.0", *lin[p + ff + ".net.0.proj"], rank),
                     (f"double_blocks.{i}.{s}_mlp.2", *lin[p + ff + ".net.2"], rank),
                     (f"double_blocks.{i}.{s}_mod.lin", *lin[p + norm + ".linear"], rank)]
    for i in range(cfg["num_single_layers"]):
        p = f"single_transformer_blocks.{i}."
        inner, mlp = lin[p + "attn.to_q"][1], lin[p + "proj_mlp"][1]
        mods += [(f"single_blocks.{i}.linear1", lin[p + "attn.to_q"][0], 3 * inner + mlp, 2 * rank),
                 (f"single_blocks.{i}.linear2", *lin[p + "proj_out"], rank),
                 (f"single_blocks.{i}.modulation.lin", *lin[p + "norm.linear"], rank)]
    return mods


def _kohya_alpha(name, rank):
    """Alphas unlike the rank, a module kind without (alpha = rank)."""
    if name.endswith("mlp.2") or name.startswith("final_layer."):
        return None
    return rank * (0.5 if "attn" in name else 1.5)


EXTRA_BLOCK = 9  # "kohya_extra": a double and a single block of this index, past the test model's


# FLUX.1's top-level BFL linears and their diffusers modules (diffusers' kohya converter maps them, then drops them).
FLUX1_TOP = (("img_in", "x_embedder"), ("txt_in", "context_embedder"),
             ("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"),
             ("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"),
             ("vector_in.in_layer", "time_text_embed.text_embedder.linear_1"),
             ("vector_in.out_layer", "time_text_embed.text_embedder.linear_2"),
             ("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"),
             ("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"),
             ("final_layer.linear", "proj_out"), ("final_layer.adaLN_modulation.1", "norm_out.linear"))


def make_flux1_kohya(ctx, path, seed, comfy=False, extra=False, top=False):
    """sd-scripts' FLUX.1 file (comfy: under diffusion_model. with dotted names); with `extra`, keys of a double
    and a single block the model does not have too (diffusers leaves them out with a warning); with `top`, the
    top-level linears too (FLUX1_TOP; the final layer's without alpha: diffusers' converter reads none there)."""
    mods = flux1_bfl_modules(ctx["linears"], ctx["config"])
    if top:
        mods += [(bfl, *ctx["linears"][ours], 4) for bfl, ours in FLUX1_TOP if ours in ctx["linears"]]
    if extra:
        assert ctx["config"]["num_layers"] <= EXTRA_BLOCK and ctx["config"]["num_single_layers"] <= EXTRA_BLOCK
        mods += [(n.replace("double_blocks.0.", f"double_blocks.{EXTRA_BLOCK}."), i, o, r)
                 for n, i, o, r in mods if n.startswith("double_blocks.0.img_attn.proj")]
        mods += [(n.replace("single_blocks.0.", f"single_blocks.{EXTRA_BLOCK}."), i, o, r)
                 for n, i, o, r in mods if n.startswith("single_blocks.0.linear2")]
    if comfy:
        return _write_original(path, seed, mods, lambda n: "diffusion_model." + n, alphas=_kohya_alpha)
    return _write_original(path, seed, mods, lambda n: "lora_unet_" + n.replace(".", "_"), alphas=_kohya_alpha)


# FLUX.2's top-level BFL linears and their diffusers modules; diffusers' kohya converter reads the first five only.
FLUX2_TOP = (("img_in", "x_embedder"), ("txt_in", "context_embedder"),
             ("time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"),
             ("time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"),
             ("final_layer.linear", "proj_out"), ("final_layer.adaLN_modulation.1", "norm_out.linear"),
             ("single_stream_modulation.lin", "single_stream_modulation.linear"),
             ("double_stream_modulation_img.lin", "double_stream_modulation_img.linear"),
             ("double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"))
FLUX2_KOHYA_TOP = ("img_in", "txt_in", "time_in.in_layer", "time_in.out_layer", "final_layer.linear")


def flux2_bfl_modules(lin, cfg, rank=4, top=None):
    """FLUX.2's BFL linears (name, in, out, rank): fused qkv, the MLPs, linear1 / linear2 (packed as the model
    packs them), and the top-level linears named in `top` (all of FLUX2_TOP when None)."""
    mods = []
    for i in range(cfg["num_layers"]):
        p = f"transformer_blocks.{i}."
        for s, q, o, ff in (("img", "to_q", "to_out.0", "ff"), ("txt", "add_q_proj", "to_add_out", "ff_context")):
            mods += [(f"double_blocks.{i}.{s}_attn.qkv", lin[p + "attn." + q][0], 3 * lin[p + "attn." + q][1], rank),
                     (f"double_blocks.{i}.{s}_attn.proj", *lin[p + "attn." + o], rank),
                     (f"double_blocks.{i}.{s}_mlp.0", *lin[p + ff + ".linear_in"], rank),
                     (f"double_blocks.{i}.{s}_mlp.2", *lin[p + ff + ".linear_out"], rank)]
    for i in range(cfg["num_single_layers"]):
        p = f"single_transformer_blocks.{i}.attn."
        mods += [(f"single_blocks.{i}.linear1", *lin[p + "to_qkv_mlp_proj"], rank),
                 (f"single_blocks.{i}.linear2", *lin[p + "to_out"], rank)]
    mods += [(bfl, *lin[ours], rank) for bfl, ours in FLUX2_TOP if ours in lin and (top is None or bfl in top)]
    return mods


def make_flux1_kohya_te(ctx, path, seed):
    """A kohya FLUX.1 file with CLIP text-encoder keys too (lora_te1_text_model_encoder_layers_0_self_attn_q_proj,
    mlp_fc1, ...), from text_encoder/config.json's widths; the transformer's keys as make_flux1_kohya's."""
    from safetensors.torch import load_file
    te = json.load(open(os.path.join(ctx["folder"], "text_encoder", "config.json")))
    h, inter = te["hidden_size"], te["intermediate_size"]
    mods = []
    for i in range(te["num_hidden_layers"]):
        p = f"text_model.encoder.layers.{i}."
        mods += [(p + f"self_attn.{x}_proj", h, h, 4) for x in ("q", "k", "v", "out")]
        mods += [(p + "mlp.fc1", h, inter, 4), (p + "mlp.fc2", inter, h, 4)]
    _write_original(path, seed + 1000, mods, lambda n: "lora_te1_" + n.replace(".", "_"), alphas=_kohya_alpha)
    sd = load_file(path)
    make_flux1_kohya(ctx, path, seed)
    sd.update(load_file(path))
    return save_plain(path, sd)


def make_flux2_bfl(ctx, path, seed):
    """ai-toolkit's FLUX.2 file: diffusion_model.<BFL name>.lora_A / lora_B, no alpha."""
    return _write_original(path, seed, flux2_bfl_modules(ctx["linears"], ctx["config"]),
                           lambda n: "diffusion_model." + n, down="lora_A", up="lora_B")


def make_flux2_kohya(ctx, path, seed):
    """sd-scripts' FLUX.2 file: lora_unet_<BFL name with _>.lora_down / lora_up / alpha."""
    return _write_original(path, seed, flux2_bfl_modules(ctx["linears"], ctx["config"], top=FLUX2_KOHYA_TOP),
                           lambda n: "lora_unet_" + n.replace(".", "_"), alphas=_kohya_alpha)


def make_qwen_kohya(ctx, path, seed, targets, rank=4):
    """lora_unet_<module with _ for .>.lora_down / lora_up / alpha (diffusers' Qwen converter needs every alpha)."""
    lin = ctx["linears"]
    mods = [(n, *lin[n], rank) for n in targets]
    return _write_original(path, seed, mods, lambda n: "lora_unet_" + n.replace(".", "_"),
                           alphas=lambda n, r: r * (0.5 if "attn" in n else 2.0))


def make_wan_original(ctx, path, seed, rank=4):
    """Wan's original names under diffusion_model. (LightX2V): blocks with alpha, the embedders and head without."""
    lin, cfg = ctx["linears"], ctx["config"]
    mods = []
    for i in range(cfg["num_layers"]):
        p = f"blocks.{i}."
        for orig, attn in (("self_attn", "attn1"), ("cross_attn", "attn2")):
            for o, c in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0")):
                mods.append((f"{p}{orig}.{o}", *lin[f"{p}{attn}.{c}"], rank))
        mods += [(f"{p}ffn.0", *lin[p + "ffn.net.0.proj"], rank), (f"{p}ffn.2", *lin[p + "ffn.net.2"], rank)]
    for orig, ours in (("head.head", "proj_out"), ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
                       ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
                       ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
                       ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
                       ("time_projection.1", "condition_embedder.time_proj")):
        mods.append((orig, *lin[ours], rank))

    def alphas(name, r):
        if not name.startswith("blocks."):
            return None
        return None if name.endswith("ffn.2") else r * (0.5 if "self_attn" in name else 3.0)
    return _write_original(path, seed, mods, lambda n: "diffusion_model." + n, alphas=alphas)


def describe(path):
    """'N tensors, metadata keys ...' of a written adapter file (for the log)."""
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        keys = list(f.keys())
    lora_meta = json.loads(meta["lora_adapter_metadata"]) if "lora_adapter_metadata" in meta else None
    if lora_meta:  # save_lora_weights prefixes each field with the component ("transformer.r")
        lora_meta = {k.split(".", 1)[-1]: v for k, v in lora_meta.items()}
    extra = ""
    if lora_meta:
        extra = (f", metadata r {lora_meta.get('r')} alpha {lora_meta.get('lora_alpha')}"
                 + (f" rank_pattern {lora_meta['rank_pattern']}" if lora_meta.get("rank_pattern") else "")
                 + (f" alpha_pattern {lora_meta['alpha_pattern']}" if lora_meta.get("alpha_pattern") else "")
                 + (" rslora" if lora_meta.get("use_rslora") else ""))
    return f"{len(keys)} tensors, first {keys[0]}{extra}"
