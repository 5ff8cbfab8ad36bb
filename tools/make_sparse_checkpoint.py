#!/usr/bin/env python3
"""Write a FLUX.1, FLUX.2, Qwen-Image or Wan transformer checkpoint, or FLUX.2-dev's,
Qwen-Image's or Wan's (UMT5-XXL) text encoder, as sparse files: real tensor names, shapes and shard layout, no real
bytes (holes read as zeros), so a 24 GB (FLUX.1-dev), 64 GB (FLUX.2-dev) or
48 GB (Mistral-Small-24B) checkpoint costs no disk. Names, shapes and
state_dict order come from the library's own class built on the meta device;
shards are filled greedily in state_dict order up to --max-shard-size, as
save_pretrained does, and the index is the library's.

  make_sparse_checkpoint.py OUT [--arch flux1-dev|flux2-dev|flux2-klein-4b|flux2-klein-9b|mistral-small-24b|
                                        qwen-image|qwen2.5-vl-7b|wan2.1-1.3b|wan2.1-14b|umt5-xxl]
                            [--layers N] [--single-layers N] [--max-shard-size SIZE] [--dtype bf16]

--layers / --single-layers override the architecture's block counts (a
shortened model of the same width; mistral-small-24b: --layers is the text
model's num_hidden_layers; umt5-xxl: the encoder's num_layers). The FLUX.2
configurations are those of diffusers' scripts/convert_flux2_to_diffusers.py (flux2-dev = the class's defaults;
klein-4b / klein-9b without the guidance embedder).

mistral-small-24b is FLUX.2-dev's text_encoder/ (Mistral-Small-3.1-24B-Instruct-2503):
transformers' Mistral3ForConditionalGeneration (Mistral text model 5120 wide,
40 layers, 32 heads / 8 KV heads x 128, MLP 32768, vocab 131072, rope theta
1e9, untied lm_head; Pixtral vision tower 1024 wide, 24 layers, image 1540,
patch 14; the multi-modal projector), 24.0 B parameters. The tensor names are
the ones save_pretrained writes (transformers 5.17 reverts its in-memory key
mapping when saving: language_model.model.*, language_model.lm_head,
vision_tower.*, multi_modal_projector.*), taken from transformers' own
revert_weight_conversion on the meta model, in the order save_pretrained
shards them; files model-0000i-of-0000n.safetensors and
model.safetensors.index.json. Default shard size 5GB, as the published
checkpoint is sharded (10 files); transformers 5.17's own default (50GB)
would write one file.
"""
import argparse
import json
import os
import struct
import sys

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "py"))
import tprun_tools  # noqa: E402

# diffusers transformers: (class name, constructor arguments). Block counts
# come from --layers / --single-layers when given.
ARCHS = {
    "flux1-dev": ("FluxTransformer2DModel", dict(
        in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))),
    # Flux2Transformer2DModel's defaults, spelled out.
    "flux2-dev": ("Flux2Transformer2DModel", dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
        num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=True)),
    "flux2-klein-4b": ("Flux2Transformer2DModel", dict(
        patch_size=1, in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=7680, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False)),
    "flux2-klein-9b": ("Flux2Transformer2DModel", dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=24, attention_head_dim=128,
        num_attention_heads=32, joint_attention_dim=12288, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False)),
    # Qwen/Qwen-Image's (and Qwen-Image-2512's) transformer/config.json.
    "qwen-image": ("QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))),
    # Wan-AI/Wan2.1-T2V-1.3B-Diffusers' and Wan2.1-T2V-14B-Diffusers' transformer/config.json (Wan2.2-T2V-A14B's
    # two experts have the 14B config): dim 1536 = 12 x 128, FFN 8960, 30 layers; 5120 = 40 x 128, 13824, 40.
    "wan2.1-1.3b": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024)),
    "wan2.1-14b": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024)),
}
# transformers models: builder of (class name, config) from --layers.
TRANSFORMERS_ARCHS = {"mistral-small-24b": lambda layers: mistral_small_24b(layers),
                      "qwen2.5-vl-7b": lambda layers: qwen2_5_vl_7b(layers),
                      "umt5-xxl": lambda layers: umt5_xxl_encoder(layers)}


def qwen2_5_vl_7b(layers):
    """Qwen2.5-VL-7B as Qwen-Image's text_encoder/config.json has it (the hub's flat transformers 4.x
    layout, read by transformers 5 as it reads the hub's file)."""
    from transformers import Qwen2_5_VLConfig
    cfg = Qwen2_5_VLConfig.from_dict({
        "hidden_size": 3584, "num_hidden_layers": layers or 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "max_position_embeddings": 128000, "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "tie_word_embeddings": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "image_token_id": 151655, "video_token_id": 151656,
        "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                          "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                          "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                          "temporal_patch_size": 2}})
    return "Qwen2_5_VLForConditionalGeneration", cfg


def mistral_small_24b(layers):
    """Mistral-Small-3.1-24B-Instruct-2503 as FLUX.2-dev's text_encoder/config.json has it."""
    from transformers import Mistral3Config, MistralConfig, PixtralVisionConfig
    text = MistralConfig(hidden_size=5120, num_hidden_layers=layers or 40, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, intermediate_size=32768, vocab_size=131072,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu",
                         rope_parameters={"rope_theta": 1000000000.0, "rope_type": "default"},
                         sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    vision = PixtralVisionConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, head_dim=64,
                                 intermediate_size=4096, image_size=1540, patch_size=14, num_channels=3,
                                 hidden_act="silu")
    cfg = Mistral3Config(text_config=text, vision_config=vision, image_token_index=10, spatial_merge_size=2,
                         multimodal_projector_bias=False, projector_hidden_act="gelu", vision_feature_layer=-1,
                         tie_word_embeddings=False)
    return "Mistral3ForConditionalGeneration", cfg

def umt5_xxl_encoder(layers):
    """UMT5EncoderModel, google/umt5-xxl's encoder as the Wan 2.1 / 2.2 folders' text_encoder/config.json has it
    (4096 wide, 24 layers, 64 heads x 64, gated-gelu FFN 10240, vocab 256384, a relative position bias in every
    layer); 5.7 B parameters, only shared.weight saved for the tied input embeddings."""
    from transformers import UMT5Config
    cfg = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=layers or 24,
                     num_decoder_layers=24, num_heads=64, relative_attention_num_buckets=32,
                     relative_attention_max_distance=128, dropout_rate=0.1, layer_norm_epsilon=1e-6,
                     feed_forward_proj="gated-gelu", is_encoder_decoder=True, use_cache=True, pad_token_id=0,
                     eos_token_id=1, decoder_start_token_id=0, scalable_attention=True, output_past=True,
                     tokenizer_class="T5Tokenizer")
    return "UMT5EncoderModel", cfg


# --dtype: torch's dtype (by name), safetensors' dtype, element size.
DTYPES = {"bf16": ("bfloat16", "BF16", 2), "fp16": ("float16", "F16", 2), "fp32": ("float32", "F32", 4)}
# Tensors that keep their own dtype whatever --dtype says (BatchNorm's
# num_batches_tracked): safetensors dtype and element size.
KEPT_DTYPES = {"torch.int64": ("I64", 8), "torch.int32": ("I32", 4), "torch.uint8": ("U8", 1), "torch.bool": ("BOOL", 1)}


def state_entry(name, tensor):
    """(name, shape) of a floating-point tensor (written in --dtype), else (name, shape, (dtype, size))."""
    if tensor.is_floating_point():
        return (name, tuple(tensor.shape))
    return (name, tuple(tensor.shape), KEPT_DTYPES[str(tensor.dtype)])


def entry_type(entry, st_dtype, elem):
    """The safetensors dtype and element size an entry of a state is written in."""
    return entry[2] if len(entry) > 2 else (st_dtype, elem)


def parse_size(text):
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.upper()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def write_sparse_safetensors(path, tensors, st_dtype, elem):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for entry in sorted(tensors, key=lambda t: t[0]):
        name, shape = entry[:2]
        dtype, n = entry_type(entry, st_dtype, elem)
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.truncate(8 + len(text) + offset)  # the data: one hole
    return offset


def meta_state(args):
    """(class name, [state_entry] in save order, save_config(out), weights file stem, total parameters)."""
    if args.arch in TRANSFORMERS_ARCHS:
        if args.single_layers is not None:
            raise SystemExit(f"--single-layers does not apply to {args.arch}")
        cls_name, cfg = TRANSFORMERS_ARCHS[args.arch](args.layers)
        state, save_config, parameters = transformers_meta_state(cls_name, cfg, args.dtype)
        layers = cfg.get_text_config().num_hidden_layers
        vision = " + vision tower" if getattr(cfg, "vision_config", None) is not None else ""
        return (cls_name, state, save_config, "model", parameters, f"{layers} text layers{vision}")
    cls_name, cfg = ARCHS[args.arch]
    cfg = dict(cfg)
    if args.layers is not None:
        cfg["num_layers"] = args.layers
    if args.single_layers is not None:
        cfg["num_single_layers"] = args.single_layers
    state, save_config = diffusers_meta_state(cls_name, cfg)
    blocks = f"{cfg['num_layers']} + {cfg['num_single_layers']} blocks" if "num_single_layers" in cfg else \
        f"{cfg['num_layers']} blocks"
    return (cls_name, state, save_config, "diffusion_pytorch_model", None, blocks)


def transformers_meta_state(cls_name, cfg, dtype):
    """A transformers model built on the meta device from cfg: ([state_entry] in the order
    save_pretrained writes them, the config's save_pretrained, total parameters)."""
    import torch
    import transformers
    from transformers.modeling_utils import remove_tied_weights_from_state_dict, revert_weight_conversion
    cfg.architectures = [cls_name]
    cfg.dtype = getattr(torch, DTYPES[dtype][0])
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(cfg)
    # What save_pretrained writes: tied copies removed, the in-memory key mapping reverted.
    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    state = revert_weight_conversion(model, state)
    return [state_entry(k, v) for k, v in state.items()], cfg.save_pretrained, model.num_parameters()


def diffusers_meta_state(cls_name, cfg):
    """A diffusers model built on the meta device from its constructor arguments:
    ([state_entry] in state_dict order, its save_config)."""
    import diffusers
    import torch
    with torch.device("meta"):
        model = getattr(diffusers, cls_name)(**cfg)
    return [state_entry(k, v) for k, v in model.state_dict().items()], model.save_config


def write_checkpoint(out, state, save_config, stem, parameters, limit, dtype):
    """config.json (save_config(out)) and state [state_entry] as sparse safetensors shards of at
    most limit bytes in out, with stem's index when there is more than one; (bytes, shard count)."""
    _, st_dtype, elem = DTYPES[dtype]
    # huggingface_hub's split_torch_state_dict_into_shards (diffusers and transformers both use it):
    # greedy in state_dict order; a tensor larger than the limit gets a shard of its own.
    shards, current, size = [], [], 0
    for entry in state:
        n = entry_type(entry, st_dtype, elem)[1]
        for d in entry[1]:
            n *= d
        if n > limit:
            shards.append([entry])
            continue
        if current and size + n > limit:
            shards.append(current)
            current, size = [], 0
        current.append(entry)
        size += n
    if current:
        shards.append(current)
    os.makedirs(out, exist_ok=True)
    save_config(out)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = (f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else f"{stem}.safetensors")
        total += write_sparse_safetensors(os.path.join(out, fname), shard, st_dtype, elem)
        for entry in shard:
            weight_map[entry[0]] = fname
    if len(shards) > 1:
        metadata = {"total_size": total}
        if parameters is not None:
            metadata["total_parameters"] = parameters
        with open(os.path.join(out, f"{stem}.safetensors.index.json"), "w") as f:
            json.dump({"metadata": metadata, "weight_map": weight_map}, f, indent=2, sort_keys=True)
            f.write("\n")
    return total, len(shards)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--arch", default="flux1-dev", choices=list(ARCHS) + list(TRANSFORMERS_ARCHS))
    ap.add_argument("--layers", type=int, default=None,
                    help="double-stream blocks (mistral-small-24b: text layers); default: the architecture's")
    ap.add_argument("--single-layers", type=int, default=None, help="single-stream blocks (default: the architecture's)")
    ap.add_argument("--max-shard-size", default=None, help="default 10GB (diffusers), 5GB (transformers models)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = ap.parse_args()
    tprun_tools.use_venv()
    cls_name, state, save_config, stem, parameters, what = meta_state(args)
    limit = parse_size(args.max_shard_size or ("5GB" if args.arch in TRANSFORMERS_ARCHS else "10GB"))
    total, shards = write_checkpoint(args.out, state, save_config, stem, parameters, limit, args.dtype)
    print(f"{args.out}: {cls_name} ({args.arch}, {what}), {len(state)} tensors, {total / 1e9:.2f} GB in {shards} sparse shard(s)")


if __name__ == "__main__":
    main()
