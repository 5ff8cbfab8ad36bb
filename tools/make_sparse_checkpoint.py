#!/usr/bin/env python3
"""Write a FLUX.1 or FLUX.2 transformer checkpoint as sparse files: real
diffusers tensor names, shapes and shard layout, no real bytes (holes read as
zeros), so a 24 GB (FLUX.1-dev) or 64 GB (FLUX.2-dev) checkpoint costs no
disk. Names, shapes and state_dict order come from diffusers' own class
(FluxTransformer2DModel or Flux2Transformer2DModel) built on the meta device;
shards are filled greedily in state_dict order up to --max-shard-size, as
save_pretrained does, and the index is diffusers'.

  make_sparse_checkpoint.py OUT [--arch flux1-dev|flux2-dev|flux2-klein-4b|flux2-klein-9b]
                            [--layers N] [--single-layers N] [--max-shard-size 10GB] [--dtype bf16]

--layers / --single-layers override the architecture's block counts (a
shortened model of the same width). The FLUX.2 configurations are those of
diffusers' scripts/convert_flux2_to_diffusers.py (flux2-dev = the class's
defaults; klein-4b / klein-9b without the guidance embedder).
"""
import argparse
import json
import os
import struct

import torch
from diffusers import Flux2Transformer2DModel, FluxTransformer2DModel

# (class, constructor arguments). Block counts come from --layers / --single-layers when given.
ARCHS = {
    "flux1-dev": (FluxTransformer2DModel, dict(
        in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))),
    # Flux2Transformer2DModel's defaults, spelled out.
    "flux2-dev": (Flux2Transformer2DModel, dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
        num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=True)),
    "flux2-klein-4b": (Flux2Transformer2DModel, dict(
        patch_size=1, in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=7680, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False)),
    "flux2-klein-9b": (Flux2Transformer2DModel, dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=24, attention_head_dim=128,
        num_attention_heads=32, joint_attention_dim=12288, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False)),
}

DTYPES = {"bf16": (torch.bfloat16, "BF16", 2), "fp16": (torch.float16, "F16", 2), "fp32": (torch.float32, "F32", 4)}


def parse_size(text):
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.upper()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def write_sparse_safetensors(path, tensors, st_dtype, elem):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in sorted(tensors, key=lambda t: t[0]):
        n = elem
        for d in shape:
            n *= d
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.truncate(8 + len(text) + offset)  # the data: one hole
    return offset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="flux1-dev", choices=list(ARCHS))
    ap.add_argument("--layers", type=int, default=None, help="double-stream blocks (default: the architecture's)")
    ap.add_argument("--single-layers", type=int, default=None, help="single-stream blocks (default: the architecture's)")
    ap.add_argument("--max-shard-size", default="10GB")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = ap.parse_args()
    torch_dtype, st_dtype, elem = DTYPES[args.dtype]
    cls, cfg = ARCHS[args.arch]
    cfg = dict(cfg)
    if args.layers is not None:
        cfg["num_layers"] = args.layers
    if args.single_layers is not None:
        cfg["num_single_layers"] = args.single_layers
    with torch.device("meta"):
        model = cls(**cfg)
    state = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    limit = parse_size(args.max_shard_size)
    shards, size = [[]], 0
    for name, shape in state:
        n = elem
        for d in shape:
            n *= d
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += n
    os.makedirs(args.out, exist_ok=True)
    model.save_config(args.out)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = (f"diffusion_pytorch_model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                 if len(shards) > 1 else "diffusion_pytorch_model.safetensors")
        total += write_sparse_safetensors(os.path.join(args.out, fname), shard, st_dtype, elem)
        for name, _ in shard:
            weight_map[name] = fname
    if len(shards) > 1:
        with open(os.path.join(args.out, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
            f.write("\n")
    print(f"{args.out}: {cls.__name__} ({args.arch}, {cfg['num_layers']} + {cfg['num_single_layers']} blocks), {len(state)} tensors, {total / 1e9:.2f} GB in {len(shards)} sparse shard(s)")


if __name__ == "__main__":
    main()
