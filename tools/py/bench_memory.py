"""tools/bench_memory's Python: its models and inputs (random weights from diffusers' own classes),
and the transformer table's rows.

  python tools/py/bench_memory.py vae WORKDIR SIDE...
      WORKDIR/vae: an AutoencoderKL of FLUX.1's width (fp32, seed 0), and one latent
      WORKDIR/z<SIDE>.safetensors per image side (16 x SIDE/8 x SIDE/8); existing files are kept
  python tools/py/bench_memory.py transformer WORKDIR
      WORKDIR/flux1_2x2: a FLUX.1-width FluxTransformer2DModel, 2 double + 2 single blocks, bf16,
      and WORKDIR/flux1_2x2_inputs.safetensors (1024 image + 512 text tokens)
  python tools/py/bench_memory.py step-row STEP_JSON LABEL
      one markdown row of the transformer table from `tprun bench step`'s JSON line

tools/bench_memory runs these (`tools/bench_memory --help` describes the benchmark).
"""
import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tprun_tools  # noqa: E402


def make_vae(work, sides):
    import torch
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file
    vae_dir = os.path.join(work, "vae")
    if not os.path.exists(os.path.join(vae_dir, "config.json")):
        torch.manual_seed(0)
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
                            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            layers_per_block=2, norm_num_groups=32, sample_size=1024, scaling_factor=0.3611,
                            shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)
        vae.save_pretrained(vae_dir)
    g = torch.Generator().manual_seed(1)
    for side in sides:
        path = os.path.join(work, f"z{side}.safetensors")
        if not os.path.exists(path):
            save_file({"latents": torch.randn(1, 16, side // 8, side // 8, generator=g)}, path)


def make_transformer(work):
    import torch
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import save_file
    tdir = os.path.join(work, "flux1_2x2")
    if not os.path.exists(os.path.join(tdir, "config.json")):
        torch.manual_seed(0)
        m = FluxTransformer2DModel(num_layers=2, num_single_layers=2, guidance_embeds=True).to(torch.bfloat16)
        m.save_pretrained(tdir)
    path = os.path.join(work, "flux1_2x2_inputs.safetensors")
    if not os.path.exists(path):
        g = torch.Generator().manual_seed(2)
        h = w = 32  # 1024 image tokens (a 512x512 image)
        txt = 512
        img_ids = torch.zeros(h, w, 3)
        img_ids[..., 1] = torch.arange(h)[:, None]
        img_ids[..., 2] = torch.arange(w)[None, :]
        save_file({"hidden_states": torch.randn(1, h * w, 64, generator=g),
                   "encoder_hidden_states": torch.randn(1, txt, 4096, generator=g),
                   "pooled_projections": torch.randn(1, 768, generator=g),
                   "timestep": torch.tensor([0.5]), "guidance": torch.tensor([3.5]),
                   "img_ids": img_ids.reshape(h * w, 3), "txt_ids": torch.zeros(txt, 3)}, path)


def step_row(path, label):
    with open(path) as f:
        j = json.load(f)
    o = j["offload"]
    gib = lambda b: b / 2**30  # noqa: E731
    tprun_tools.table_row([label, j["tp"], f"{gib(j['bytes_resident_weights']):.2f}",
                           f"{gib(o['max_bytes_in_flight']):.2f}", f"{gib(j['rss_after_load_bytes']):.2f}",
                           f"{gib(j['peak_rss_bytes']):.2f}", f"{j['median_s']:.2f}",
                           f"{o['loads']} / {o['prefetch_hits']}", f"{o['wait_s']:.2f}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("vae", help="the VAE and one latent per side")
    v.add_argument("work")
    v.add_argument("sides", nargs="+", type=int)
    t = sub.add_parser("transformer", help="the 2+2-block transformer and its inputs")
    t.add_argument("work")
    s = sub.add_parser("step-row", help="a transformer table row from bench step's JSON")
    s.add_argument("json")
    s.add_argument("label")
    args = ap.parse_args()
    if args.cmd == "vae":
        make_vae(args.work, args.sides)
    elif args.cmd == "transformer":
        make_transformer(args.work)
    else:
        step_row(args.json, args.label)


if __name__ == "__main__":
    main()
