#!/usr/bin/env python3
"""Write a FLUX.2 [klein] pipeline folder (Flux2KleinPipeline) with random,
seeded weights whose text encoder and transformer are about the same size, for
tools/bench_phases: a job that holds both at once ("together") against one that
holds one at a time ("staged") shows the difference only when neither dominates.

  make_bench_pipeline.py OUT [--seed 0] [--tprun PATH] [--force]

Components (bf16 safetensors, each written by its library's save_pretrained;
model_index.json by diffusers' DiffusionPipeline.save_pretrained):
  text_encoder/  transformers' Qwen3ForCausalLM in Qwen3-0.6B's shape: 28 layers,
                 hidden 1024, MLP 3072, 16 heads / 8 KV heads x 128, rope theta
                 1e6, tied embeddings; the vocabulary cut to the tokenizer's size
                 rounded up to 128 (Qwen3's 151936 rows would be a third of the
                 encoder); about 0.88 GB.
  transformer/   diffusers' Flux2Transformer2DModel 1536 wide (12 heads x 128),
                 joint_attention_dim 3 x 1024 (the pipeline stacks three hidden
                 states of the encoder), in_channels 128 (the VAE's 32 latent
                 channels, 2x2 patches), no guidance embedder, 2 double + 9
                 single blocks: the block counts nearest the encoder's bytes
                 (a double block weighs two single ones) at about [klein]'s 1:4.
  vae/           diffusers' AutoencoderKLFlux2, narrow (32/64/128/128 channels,
                 one layer per block), 32 latent channels as the real one.
  scheduler/, tokenizer/  copied from `tprun init-model TMP --arch flux2-klein`
                 (its chat template and vocabulary; every id is below the vocab).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "py"))
import tprun_tools  # noqa: E402


# Qwen3-0.6B's config.json (Qwen/Qwen3-0.6B), but for the vocabulary.
QWEN3_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=40960,
                  rms_norm_eps=1e-6, rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
                  attention_bias=False, tie_word_embeddings=True, use_sliding_window=False, max_window_layers=28)
TRANSFORMER = dict(patch_size=1, in_channels=128, num_layers=2, num_single_layers=9, attention_head_dim=128,
                   num_attention_heads=12, joint_attention_dim=3 * 1024, timestep_guidance_channels=256,
                   mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6,
                   guidance_embeds=False)
VAE = dict(block_out_channels=(32, 64, 128, 128), layers_per_block=1, latent_channels=32, norm_num_groups=32)


def tokenizer_size(tokenizer_dir):
    """One more than the largest id of tokenizer.json (vocabulary and added tokens)."""
    with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def tiny_klein(tprun, where):
    folder = os.path.join(where, "tiny")
    subprocess.run([tprun, "init-model", folder, "--arch", "flux2-klein"], check=True, stdout=subprocess.DEVNULL)
    return folder


def build_pipeline(tiny, seed):
    import torch
    from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline,
                           Flux2Transformer2DModel)
    from transformers import Qwen2TokenizerFast, Qwen3Config, Qwen3ForCausalLM
    vocab = -(-tokenizer_size(os.path.join(tiny, "tokenizer")) // 128) * 128
    torch.manual_seed(seed)
    encoder = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, **QWEN3_0_6B)).to(torch.bfloat16).eval()
    transformer = Flux2Transformer2DModel(**TRANSFORMER).to(torch.bfloat16)
    vae = AutoencoderKLFlux2(**VAE).to(torch.bfloat16)
    return Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(tiny, "scheduler")),
                              vae=vae, text_encoder=encoder,
                              tokenizer=Qwen2TokenizerFast.from_pretrained(os.path.join(tiny, "tokenizer")),
                              transformer=transformer)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tprun", default=tprun_tools.tprun_binary(), help="default: TPRUN_BIN, TPRUN_BUILD_DIR/bin/tprun")
    ap.add_argument("--force", action="store_true", help="replace OUT when it exists")
    args = ap.parse_args()
    tprun_tools.use_venv()
    if os.path.exists(args.out) and os.listdir(args.out):
        if not args.force:
            sys.exit(f"{args.out} exists and is not empty (--force replaces it)")
        shutil.rmtree(args.out)
    with tempfile.TemporaryDirectory() as where:
        tiny = tiny_klein(args.tprun, where)
        pipe = build_pipeline(tiny, args.seed)
        pipe.save_pretrained(args.out)
        # The tokenizer folder byte for byte as tprun wrote it (save_pretrained
        # would rewrite its files in transformers' own layout).
        shutil.rmtree(os.path.join(args.out, "tokenizer"))
        shutil.copytree(os.path.join(tiny, "tokenizer"), os.path.join(args.out, "tokenizer"))
    sizes = {}
    for comp in ("text_encoder", "transformer", "vae"):
        d = os.path.join(args.out, comp)
        sizes[comp] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))
    print(f"{args.out}: Flux2KleinPipeline, " + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in sizes.items()))


if __name__ == "__main__":
    main()
