#!/usr/bin/env python3
"""tprun's AutoencoderKLQwenImage (single-frame images) against diffusers' own class.

The VAE is diffusers' AutoencoderKLQwenImage built here with a tiny config (base_dim 16, z_dim 4,
dim_mult [1, 2, 2, 2]: scale factor 8, num_res_blocks 1, temperal_downsample [False, True, True], so
both the 2-D and the 3-D resamplers are there) and every parameter redrawn from a seeded generator
(weights and biases ~ N(0, 1/fan_in), every time tap of the causal convs distinct; RMS gammas ~
N(1, 0.1)), saved with save_pretrained. tprun runs `tprun forward --model VAE_FOLDER --component
vae_decoder | vae_encoder` (or no component: both halves).

Cases (one ctest entry each; `qwen_image_vae_parity.py TPRUN MPIRUN CASE`):
  decode    decode(z).sample, fp32, odd latent sizes (5x7 given as [B, z, 1, h, w], 3x6 given as
            [B, z, h, w]), within 1e-4 (clamped to [-1, 1] as diffusers); both halves loaded at tp 2
            (replicated); the resident weight bytes tprun reports equal the decoder's parameters with
            only the last time tap of each causal conv and no time_conv (what one frame uses).
  encode    encode(x).latent_dist mean and std, fp32, odd image sizes (36x44, 20x28), within 1e-4;
            the encoder's resident bytes likewise; an image too small for the downsamplers (4 px:
            diffusers raises) refused with a request error naming the side.
  slicing   a batch of 2 with --memory vae_slicing=true vs diffusers' enable_slicing(), decode and
            encode, within 1e-4.
  tiling    --memory vae_tiling=true,vae_tile_sample_size=32 (stride 24) vs diffusers'
            enable_tiling(32, 32, 24, 24): a 9x11 latent (3 x 4 tiles, partial last ones) and a 72x88
            image, within 1e-4 and visibly different from the untiled result (tiles really happened;
            the tiled decode is unclamped as diffusers'); the same tiled decode split across tp 2 (its
            tiles over the ranks) equal to tp 1 bit for bit; sliced and tiled together on a batch of 2.
  tiling_default
            --memory vae_tiling=true with diffusers' default tiles (256 px, stride 192): a 34x36
            latent and a 264x272 image (2 x 2 tiles each).
  bf16      --dtype bf16 against diffusers in bf16 (the model and inputs cast): the difference
            measured and bounded (BF16_TOL of the output's magnitude: two bf16 runs of one model
            differ in rounding only).
  errors    malformed config.json refused with one error naming the file and the field, exit 4 on
            both ranks, before any weight byte (the config is read after the checkpoint's headers,
            before any tensor): latents_mean of other than z_dim entries, latents_std with a
            zero, temperal_downsample of the wrong length, an attn_scales entry that names a level,
            num_res_blocks beyond the checkpoint's blocks, an empty dim_mult, a huge base_dim, dropout
            1.5, a string z_dim; and tiles smaller than one latent (exit 3).
"""
import os
import re
import sys

os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, run_cases, save_causal_vae  # noqa: E402

TOL = 1e-4
# bf16 against bf16, relative to the largest magnitude of the output (see case_bf16's printout).
BF16_TOL = 0.05
H = None  # tprun_harness.Harness, set in main()

TINY = dict(base_dim=16, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True, True], dropout=0.0,
            latents_mean=[0.1, -0.2, 0.3, -0.4], latents_std=[1.5, 0.5, 2.0, 1.0])
SF = 8


def make_vae(work, name="vae"):
    """diffusers' AutoencoderKLQwenImage with the tiny config and redrawn parameters, saved to work/name."""
    from diffusers import AutoencoderKLQwenImage
    torch.manual_seed(0)
    return save_causal_vae(AutoencoderKLQwenImage(**TINY).eval(), 1234, os.path.join(work, name))


def forward(work, folder, comp, inputs, tag, memory=(), np_=1, dtype="fp32"):
    """(outputs, log) of `tprun forward` (Harness.forward); outputs None when it failed (reported)."""
    return H.forward(work, folder, comp, inputs, tag, memory=memory, np_=np_, dtype=dtype)


def compare(tag, got, want, tol=TOL):
    return H.compare(tag, got, want, tol)


def latents(batch, h, w, seed=7):
    return torch.randn(batch, TINY["z_dim"], 1, h, w, generator=torch.Generator().manual_seed(seed))


def image(batch, h, w, seed=8):
    return torch.rand(batch, 3, 1, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def diffusers_decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


def diffusers_encode(vae, x):
    with torch.no_grad():
        dist = vae.encode(x).latent_dist
        return dist.mean, dist.std


def resident_bytes(vae, prefixes):
    """Bytes of the parameters under `prefixes` as one frame uses them: the last time tap of each
    causal conv weight, no resampler time_conv."""
    total = 0
    for name, p in vae.named_parameters():
        if not name.startswith(prefixes) or ".time_conv." in name:
            continue
        n = p.numel() // p.shape[2] if p.dim() == 5 else p.numel()
        total += n * p.element_size()
    return total


def stored_bytes(log):
    m = re.search(r"stored (\d+) bytes", log or "")
    return int(m.group(1)) if m else None


def case_decode(work):
    vae, folder = make_vae(work)
    z = latents(1, 5, 7)
    want = diffusers_decode(vae, z)
    print(f"diffusers decode: {tuple(want.shape)}, share clamped {(want.abs() == 1).float().mean().item():.3f}")
    got, log = forward(work, folder, "vae_decoder", {"latents": z}, "dec")
    if got is not None:
        compare("decode 5x7 [B, z, 1, h, w]", got["sample"], want)
        expect = resident_bytes(vae, ("decoder.", "post_quant_conv."))
        H.check(stored_bytes(log) == expect, f"decoder resident bytes {stored_bytes(log)} (expected {expect}: "
                "last time taps only, no time_conv)")
    z2 = latents(1, 3, 6, seed=9)
    want2 = diffusers_decode(vae, z2)
    got, _ = forward(work, folder, "vae_decoder", {"latents": z2[:, :, 0]}, "dec4d")
    if got is not None:
        compare("decode 3x6 given as [B, z, h, w]", got["sample"], want2)
    got, _ = forward(work, folder, None, {"latents": z}, "dec_tp2", np_=2)
    if got is not None:
        compare("decode, both halves loaded, tp 2 (replicated)", got["sample"], want)


def case_encode(work):
    vae, folder = make_vae(work)
    for i, (h, w) in enumerate([(36, 44), (20, 28)]):
        x = image(1, h, w, seed=20 + i)
        mean, std = diffusers_encode(vae, x)
        got, log = forward(work, folder, "vae_encoder", {"image": x}, f"enc{i}")
        if got is not None:
            compare(f"encode {h}x{w} mean", got["mean"], mean)
            compare(f"encode {h}x{w} std", got["std"], std)
            if i == 0:
                expect = resident_bytes(vae, ("encoder.", "quant_conv."))
                H.check(stored_bytes(log) == expect, f"encoder resident bytes {stored_bytes(log)} (expected {expect})")
    # 4 px: 4 -> 2 -> 1, and the third downsampler cannot run (diffusers raises as well).
    x = image(1, 4, 16)
    try:
        diffusers_encode(vae, x)
        H.check(False, "diffusers encodes a 4 px high image (the refusal below would be wrong)")
    except RuntimeError:
        pass
    inp = os.path.join(work, "small.safetensors")
    save_file({"image": x}, inp)
    rc, log = H.run(["forward", "--model", folder, "--component", "vae_encoder", "--inputs", inp, "--out",
                     os.path.join(work, "small_out.safetensors")], np_=1, timeout=120)
    H.check(rc == 6 and "a side of 4 px" in log and "give at least 5 px" in log,
            f"a 4 px high image: exit {rc} (want 6, a request error)" + ("" if rc == 6 else f"\n{log[-600:]}"))


def case_slicing(work):
    vae, folder = make_vae(work)
    z, x = latents(2, 4, 5), image(2, 24, 40)
    vae.enable_slicing()
    want_dec = diffusers_decode(vae, z)
    want_mean, want_std = diffusers_encode(vae, x)
    dec, _ = forward(work, folder, "vae_decoder", {"latents": z}, "dec_sliced", ("vae_slicing=true",))
    enc, _ = forward(work, folder, "vae_encoder", {"image": x}, "enc_sliced", ("vae_slicing=true",))
    if dec is not None:
        compare("sliced decode, batch 2", dec["sample"], want_dec)
    if enc is not None:
        compare("sliced encode, batch 2, mean", enc["mean"], want_mean)
        compare("sliced encode, batch 2, std", enc["std"], want_std)


def tiled_pair(work, vae, folder, z, x, tag, memory, plain):
    """tprun with `memory` vs diffusers as configured; tiled results must differ from `plain`."""
    want_dec = diffusers_decode(vae, z)
    want_mean, want_std = diffusers_encode(vae, x)
    if plain is not None:
        d = (want_dec - plain[0]).abs().max().item()
        e = (want_mean - plain[1]).abs().max().item()
        H.check(d > 1e-3 and e > 1e-3, f"{tag}: diffusers' tiled results differ from the untiled ones "
                f"(decode {d:.3g}, encode mean {e:.3g}): tiles really happened")
    file_tag = re.sub(r"[^A-Za-z0-9]+", "_", tag)
    dec, _ = forward(work, folder, "vae_decoder", {"latents": z}, f"{file_tag}_dec", memory)
    enc, _ = forward(work, folder, "vae_encoder", {"image": x}, f"{file_tag}_enc", memory)
    if dec is not None:
        compare(f"{tag} decode {tuple(z.shape)}", dec["sample"], want_dec)
    if enc is not None:
        compare(f"{tag} encode {tuple(x.shape)} mean", enc["mean"], want_mean)
        compare(f"{tag} encode std", enc["std"], want_std)
    return dec, want_dec


def case_tiling(work):
    vae, folder = make_vae(work)
    z, x = latents(1, 9, 11), image(1, 72, 88)
    plain = (diffusers_decode(vae, z), diffusers_encode(vae, x)[0])
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                      tile_sample_stride_width=24)
    mem = ("vae_tiling=true", "vae_tile_sample_size=32")
    dec, want = tiled_pair(work, vae, folder, z, x, "tiled 32/24", mem, plain)
    if dec is not None:
        # diffusers clamps the untiled decode only.
        H.check(want.abs().max() > 1 and dec["sample"].abs().max() > 1,
                f"tiled decode unclamped as diffusers': max |x| {dec['sample'].abs().max().item():.3f} "
                f"(diffusers {want.abs().max().item():.3f})")
        # The decode split over the TP group (vae_split_decode.h): its 12 tiles over 2 ranks, the same bits.
        dec2, _ = forward(work, folder, "vae_decoder", {"latents": z}, "tiled_tp2_dec", mem, np_=2)
        if dec2 is not None:
            H.check(torch.equal(dec["sample"], dec2["sample"]),
                    "tiled decode split across tp 2 equals tp 1 bit for bit")
    vae.enable_slicing()
    # 42x46: the encoder's own sizes (6x6, halving rounds up) exceed diffusers' crop to H//8 x W//8.
    z2, x2 = latents(2, 6, 5, seed=3), image(2, 42, 46, seed=4)
    tiled_pair(work, vae, folder, z2, x2, "sliced + tiled 32/24, batch 2", mem + ("vae_slicing=true",), None)


def case_tiling_default(work):
    vae, folder = make_vae(work)
    z, x = latents(1, 34, 36), image(1, 264, 272)
    plain = (diffusers_decode(vae, z), diffusers_encode(vae, x)[0])
    vae.enable_tiling()
    H.check((vae.tile_sample_min_height, vae.tile_sample_stride_height) == (256, 192),
            f"diffusers' default tiles {vae.tile_sample_min_height} / {vae.tile_sample_stride_height}")
    tiled_pair(work, vae, folder, z, x, "tiled default 256/192", ("vae_tiling=true",), plain)


def case_bf16(work):
    vae, folder = make_vae(work)
    z, x = latents(1, 5, 6), image(1, 40, 48)
    want32 = diffusers_decode(vae, z)
    vb = vae.to(torch.bfloat16)
    want_dec = diffusers_decode(vb, z.bfloat16()).float()
    want_mean = diffusers_encode(vb, x.bfloat16())[0].float()
    dec, _ = forward(work, folder, "vae_decoder", {"latents": z}, "dec_bf16", dtype="bf16")
    enc, _ = forward(work, folder, "vae_encoder", {"image": x}, "enc_bf16", dtype="bf16")
    print(f"diffusers bf16 vs fp32 decode: max abs diff {(want_dec - want32).abs().max().item():.3g}")
    if dec is not None:
        compare("bf16 decode", dec["sample"], want_dec, BF16_TOL * want_dec.abs().max().item())
    if enc is not None:
        compare("bf16 encode mean", enc["mean"], want_mean, BF16_TOL * want_mean.abs().max().item())


def case_errors(work):
    _, good = make_vae(work)
    z = latents(1, 2, 2)
    inp = os.path.join(work, "z.safetensors")
    save_file({"latents": z}, inp)
    bad_cases = [
        ("latents_mean length", {"latents_mean": [0.0] * 3}, "'latents_mean' has 3 entries but z_dim is 4"),
        ("latents_std zero", {"latents_std": [1.0, 0.0, 1.0, 1.0]}, "'latents_std' holds 0"),
        ("temperal_downsample length", {"temperal_downsample": [True]}, "'temperal_downsample' has 1 entries"),
        ("attn_scales at a level", {"attn_scales": [0.5]}, "'attn_scales' holds 0.5"),
        ("num_res_blocks beyond the checkpoint", {"num_res_blocks": 1000000}, "num_res_blocks"),
        ("empty dim_mult", {"dim_mult": []}, "dim_mult"),
        ("huge base_dim", {"base_dim": 1 << 40}, "base_dim"),
        ("dropout 1.5", {"dropout": 1.5}, "'dropout' = 1.5"),
        ("string z_dim", {"z_dim": "16"}, "z_dim"),
    ]
    H.expect_config_refusals(work, good, inp, bad_cases)
    # Tiles smaller than one latent (8 px at overlap 0.5: a stride of 4 px).
    rc, log = H.run(["forward", "--model", good, "--component", "vae_decoder", "--inputs", inp, "--out",
                     os.path.join(work, "tiles.safetensors"), "--memory", "vae_tiling=true", "--memory",
                     "vae_tile_sample_size=8", "--memory", "vae_tile_overlap=0.5"], np_=2, timeout=120)
    H.check(rc == 3 and "must both be at least the scale factor 8" in log,
            f"tiles of 8 px at a stride of 4 px: exit {rc} (want 3)" + ("" if rc == 3 else f"\n{log[-600:]}"))


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {"decode": case_decode, "encode": case_encode, "slicing": case_slicing,
                         "tiling": case_tiling, "tiling_default": case_tiling_default, "bf16": case_bf16,
                         "errors": case_errors}, "tprun-qwen-vae")


if __name__ == "__main__":
    sys.exit(main())
