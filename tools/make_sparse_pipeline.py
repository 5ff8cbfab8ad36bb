#!/usr/bin/env python3
"""Write a whole FLUX.1 [dev] / FLUX.2 [klein] 4B / [klein] 9B / FLUX.2 [dev] /
Qwen-Image / Wan 2.1 T2V 1.3B / 14B / Wan 2.2 T2V A14B pipeline folder as sparse
files: every component's real tensor names, shapes and shard layout, no
real bytes (holes read as zeros), so `tprun plan`, `tprun inspect` and loads
can be measured on full-size models without the disk (or the download). Each
component is written as tools/make_sparse_checkpoint.py writes a transformer:
its library's class built on the meta device, shards filled greedily as
save_pretrained does.

  make_sparse_pipeline.py OUT --arch flux1-dev|flux2-klein-4b|flux2-klein-9b|flux2-dev|qwen-image|
                                     wan2.1-1.3b|wan2.1-14b|wan2.2-a14b
                          [--dtype bf16] [--tprun PATH] [--force]

Where the shapes come from (no download is possible here, so the published
repositories' config.json values are written out below, each beside its source):
  transformer/    make_sparse_checkpoint.ARCHS (diffusers' classes; FLUX.2 from
                  diffusers' scripts/convert_flux2_to_diffusers.py), 10GB shards.
                  Wan: WanTransformer3DModel with the hub's Wan2.1-T2V-1.3B / -14B
                  configs; Wan 2.2 A14B: transformer/ (high-noise expert) and
                  transformer_2/ (low-noise), both with the 14B config.
  text encoders   FLUX.1 [dev]: CLIP ViT-L/14's text model (openai/clip-vit-large-
                  patch14, text_encoder/) and the T5 v1.1 XXL encoder (google/t5-v1_1-
                  xxl, text_encoder_2/); [klein] 4B: Qwen3-4B (36 layers x 2560);
                  [klein] 9B: Qwen3-8B (36 x 4096): the hidden widths are a third of
                  the transformers' joint_attention_dim (7680, 12288), the pipeline
                  stacking three hidden states; FLUX.2 [dev]: Mistral-Small-3.1-24B
                  (make_sparse_checkpoint.mistral_small_24b); Qwen-Image: Qwen2.5-VL-7B
                  (make_sparse_checkpoint.qwen2_5_vl_7b); Wan: the UMT5-XXL encoder
                  (make_sparse_checkpoint.umt5_xxl_encoder). Sharded at 5GB, as those
                  checkpoints are published (transformers 5.17's own default, 50GB,
                  would write one file).
  vae/            FLUX.1: AutoencoderKL with FLUX.1's config (16 latent channels,
                  scaling 0.3611, shift 0.1159, no quant convs); FLUX.2:
                  AutoencoderKLFlux2's defaults (diffusers: the FLUX.2 VAE); Qwen-Image:
                  AutoencoderKLQwenImage's defaults (Qwen-Image's vae/config.json);
                  Wan: AutoencoderKLWan's defaults (the Wan 2.1 VAE of all three).
  scheduler/, tokenizer*/, model_index.json
                  copied from `tprun init-model TMP --arch <family>` (tiny
                  vocabularies: every id they produce is below the real encoders'
                  vocabularies); [klein]'s model_index.json gets is_distilled true,
                  as the published 4-step [klein] 4B / 9B releases have it; Wan 2.2
                  A14B's (`--arch wan-a14b`) has boundary_ratio 0.875.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "py"))
import make_sparse_checkpoint as msc  # noqa: E402
import tprun_tools  # noqa: E402

DIFFUSERS_SHARD = msc.parse_size("10GB")  # diffusers' save_pretrained default
TRANSFORMERS_SHARD = msc.parse_size("5GB")  # as the published text encoders are sharded


def clip_l():
    """CLIPTextModel, openai/clip-vit-large-patch14's text config (FLUX.1 [dev] text_encoder/config.json)."""
    from transformers import CLIPTextConfig
    return "CLIPTextModel", CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
        pad_token_id=1, bos_token_id=0, eos_token_id=2)


def t5_xxl_encoder():
    """T5EncoderModel, google/t5-v1_1-xxl (FLUX.1 [dev] text_encoder_2/config.json)."""
    from transformers import T5Config
    return "T5EncoderModel", T5Config(
        vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.1,
        layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=False, is_encoder_decoder=False,
        use_cache=False, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def qwen3(hidden, intermediate, tied):
    """Qwen3ForCausalLM, 36 layers, 32 heads / 8 KV heads x 128, vocab 151936, rope theta 1e6, 40960
    positions (Qwen/Qwen3-4B: hidden 2560, MLP 9728, tied embeddings; Qwen/Qwen3-8B: 4096, 12288, untied)."""
    from transformers import Qwen3Config
    return "Qwen3ForCausalLM", Qwen3Config(
        vocab_size=151936, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, attention_bias=False,
        tie_word_embeddings=tied, use_sliding_window=False, max_window_layers=36, bos_token_id=151643,
        eos_token_id=151645)


# FLUX.1 [dev]'s vae/config.json (as tools/bench_memory builds it).
FLUX1_VAE = ("AutoencoderKL", dict(
    in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2,
    norm_num_groups=32, sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
    use_post_quant_conv=False))
FLUX2_VAE = ("AutoencoderKLFlux2", {})  # the class's defaults are FLUX.2's VAE
QWEN_IMAGE_VAE = ("AutoencoderKLQwenImage", {})  # the class's defaults are Qwen-Image's VAE (the Wan 2.1 design)
WAN_VAE = ("AutoencoderKLWan", {})  # the class's defaults are Wan 2.1's VAE (Wan 2.1 and Wan 2.2 A14B ship it)
WAN_TEXT = {"text_encoder": lambda: msc.umt5_xxl_encoder(None)}

# arch -> (init-model family, transformer arch, {text component: builder}, vae); the two-expert
# pipelines' second transformer in SECOND_EXPERT: arch -> its transformer arch (transformer_2/).
PIPELINES = {
    "flux1-dev": ("flux", "flux1-dev", {"text_encoder": clip_l, "text_encoder_2": t5_xxl_encoder}, FLUX1_VAE),
    "flux2-klein-4b": ("flux2-klein", "flux2-klein-4b", {"text_encoder": lambda: qwen3(2560, 9728, True)}, FLUX2_VAE),
    "flux2-klein-9b": ("flux2-klein", "flux2-klein-9b", {"text_encoder": lambda: qwen3(4096, 12288, False)}, FLUX2_VAE),
    "flux2-dev": ("flux2-dev", "flux2-dev", {"text_encoder": lambda: msc.mistral_small_24b(None)}, FLUX2_VAE),
    "qwen-image": ("qwen-image", "qwen-image", {"text_encoder": lambda: msc.qwen2_5_vl_7b(None)}, QWEN_IMAGE_VAE),
    "wan2.1-1.3b": ("wan", "wan2.1-1.3b", WAN_TEXT, WAN_VAE),
    "wan2.1-14b": ("wan", "wan2.1-14b", WAN_TEXT, WAN_VAE),
    "wan2.2-a14b": ("wan-a14b", "wan2.1-14b", WAN_TEXT, WAN_VAE),
}
SECOND_EXPERT = {"wan2.2-a14b": "wan2.1-14b"}


def write_diffusers(out, cls_name, cfg, dtype):
    state, save_config = msc.diffusers_meta_state(cls_name, cfg)
    return msc.write_checkpoint(out, state, save_config, "diffusion_pytorch_model", None, DIFFUSERS_SHARD, dtype)


def write_transformers(out, builder, dtype):
    cls_name, cfg = builder()
    state, save_config, parameters = msc.transformers_meta_state(cls_name, cfg, dtype)
    if cls_name == "CLIPTextModel":
        # transformers 5 saves CLIPTextModel without the "text_model." prefix; the
        # published FLUX.1 [dev] text_encoder/ (transformers 4) and tprun use it.
        state = [("text_model." + e[0],) + tuple(e[1:]) for e in state]
    return msc.write_checkpoint(out, state, save_config, "model", parameters, TRANSFORMERS_SHARD, dtype)


def copy_small_parts(tiny, out, distilled):
    """scheduler/, tokenizer*/ and model_index.json of the init-model folder."""
    for name in sorted(os.listdir(tiny)):
        if name == "scheduler" or name.startswith("tokenizer"):
            shutil.copytree(os.path.join(tiny, name), os.path.join(out, name))
    with open(os.path.join(tiny, "model_index.json")) as f:
        index = json.load(f)
    if "is_distilled" in index:
        index["is_distilled"] = distilled
    with open(os.path.join(out, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--arch", required=True, choices=list(PIPELINES))
    ap.add_argument("--dtype", default="bf16", choices=sorted(msc.DTYPES))
    ap.add_argument("--tprun", default=tprun_tools.tprun_binary(), help="default: TPRUN_BIN, TPRUN_BUILD_DIR/bin/tprun")
    ap.add_argument("--force", action="store_true", help="replace OUT when it exists")
    args = ap.parse_args()
    tprun_tools.use_venv()
    if os.path.exists(args.out) and os.listdir(args.out):
        if not args.force:
            sys.exit(f"{args.out} exists and is not empty (--force replaces it)")
        shutil.rmtree(args.out)
    family, transformer_arch, encoders, (vae_cls, vae_cfg) = PIPELINES[args.arch]
    os.makedirs(args.out, exist_ok=True)
    sizes = {}
    cls_name, cfg = msc.ARCHS[transformer_arch]
    sizes["transformer"] = write_diffusers(os.path.join(args.out, "transformer"), cls_name, cfg, args.dtype)
    if args.arch in SECOND_EXPERT:
        cls_2, cfg_2 = msc.ARCHS[SECOND_EXPERT[args.arch]]
        sizes["transformer_2"] = write_diffusers(os.path.join(args.out, "transformer_2"), cls_2, cfg_2, args.dtype)
    for name, builder in encoders.items():
        sizes[name] = write_transformers(os.path.join(args.out, name), builder, args.dtype)
    sizes["vae"] = write_diffusers(os.path.join(args.out, "vae"), vae_cls, vae_cfg, args.dtype)
    with tempfile.TemporaryDirectory() as where:
        tiny = os.path.join(where, "tiny")
        subprocess.run([args.tprun, "init-model", tiny, "--arch", family], check=True, stdout=subprocess.DEVNULL)
        copy_small_parts(tiny, args.out, distilled=family == "flux2-klein")
    total = sum(b for b, _ in sizes.values())
    parts = ", ".join(f"{k} {b / 1e9:.2f} GB ({n} shard{'s' if n > 1 else ''})" for k, (b, n) in sizes.items())
    print(f"{args.out}: {args.arch}, {total / 1e9:.2f} GB sparse: {parts}")


if __name__ == "__main__":
    main()
