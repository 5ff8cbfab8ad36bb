#!/usr/bin/env python3
"""tprun's AutoencoderKLWan (many frames) against diffusers' own class, and the decode split over the TP group.

The VAE is diffusers' AutoencoderKLWan built here with a tiny config (base_dim 8, decoder_base_dim 12,
z_dim 4, dim_mult [1, 2, 2, 2]: 8x in space, num_res_blocks 1, temperal_downsample [False, True, True]:
4x in time, so both the 2-D and the 3-D resamplers run) and every parameter redrawn from a seeded
generator (weights and biases ~ N(0, 1/fan_in), every time tap distinct; RMS gammas ~ N(1, 0.1)), saved
with save_pretrained. tprun runs `tprun forward --model VAE_FOLDER --component vae_decoder | vae_encoder`.

Cases (`wan_vae_parity.py TPRUN MPIRUN CASE`):
  frames    decode of 1, 2 and 3 latent frames ([B, z, F, h, w] -> 1 + 4 (F - 1) frames, odd sizes) and
            encode of 1, 5 and 9 frames (mean and std), fp32, within 1e-4 of diffusers; a 4-D latent decodes
            as one frame; slicing (a batch of 2, decode and encode) against enable_slicing(); the decoder's
            resident bytes equal its parameters (every time tap and the time_convs kept).
  tiling    --memory vae_tiling=true,vae_tile_sample_size=32 (stride 24) against diffusers'
            enable_tiling(32, 32, 24, 24): a 2-frame 7x9 latent and a 5-frame 56x72 video, within 1e-4 and
            visibly different from the untiled results (tiles really happened); then the decode split over
            the TP group (`--tp 2`, each rank decoding a part, rank 0 writing): a batch of 2 untiled videos
            and one tiled video, each equal bit for bit to the same decode at tp 1 (slicing on for the
            batch: one video at a time, as the split decodes them) and within 1e-4 of diffusers.
  errors    refusals: is_residual (Wan 2.2 TI2V-5B's VAE, named), patch_size 2, latents_mean of 3 entries,
            temperal_downsample with one time step, scale_factor_spatial 16 for 8x blocks (exit 4, on
            both ranks, before any weight byte); latents with 5 channels and a video of 4 frames (exit 6,
            request errors naming 'z' / 'image').
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
H = None  # tprun_harness.Harness, set in main()

TINY = dict(base_dim=8, decoder_base_dim=12, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True, True], dropout=0.0,
            latents_mean=[0.1, -0.2, 0.3, -0.4], latents_std=[1.5, 0.5, 2.0, 1.0])


def make_vae(work, name="vae"):
    """diffusers' AutoencoderKLWan with the tiny config and redrawn parameters, saved to work/name."""
    from diffusers import AutoencoderKLWan
    torch.manual_seed(0)
    return save_causal_vae(AutoencoderKLWan(**TINY).eval(), 4321, os.path.join(work, name))


def forward(work, folder, comp, inputs, tag, memory=(), np_=1):
    """(outputs, log) of `tprun forward` (Harness.forward); outputs None when it failed (reported)."""
    return H.forward(work, folder, comp, inputs, tag, memory=memory, np_=np_)


def compare(tag, got, want, tol=TOL):
    return H.compare(tag, got, want, tol)


def latents(batch, frames, h, w, seed=7):
    return torch.randn(batch, TINY["z_dim"], frames, h, w, generator=torch.Generator().manual_seed(seed))


def video(batch, frames, h, w, seed=8):
    return torch.rand(batch, 3, frames, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def diffusers_decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


def diffusers_encode(vae, x):
    with torch.no_grad():
        dist = vae.encode(x).latent_dist
        return dist.mean, dist.std


def stored_bytes(log):
    m = re.search(r"stored (\d+) bytes", log or "")
    return int(m.group(1)) if m else None


def case_frames(work):
    vae, folder = make_vae(work)
    for frames, (h, w) in [(1, (5, 7)), (2, (4, 5)), (3, (3, 6))]:
        z = latents(1, frames, h, w, seed=10 + frames)
        want = diffusers_decode(vae, z)
        got, log = forward(work, folder, "vae_decoder", {"latents": z}, f"dec{frames}")
        if got is not None:
            compare(f"decode of {frames} latent frames {h}x{w} -> {1 + 4 * (frames - 1)} frames", got["sample"], want)
            if frames == 1:
                expect = sum(p.numel() * p.element_size() for n, p in vae.named_parameters()
                             if n.startswith(("decoder.", "post_quant_conv.")))
                H.check(stored_bytes(log) == expect, f"decoder resident bytes {stored_bytes(log)} (expected "
                        f"{expect}: every time tap and time_conv)")
    z = latents(1, 1, 3, 4, seed=30)
    got, _ = forward(work, folder, "vae_decoder", {"latents": z[:, :, 0]}, "dec4d")
    if got is not None:
        compare("decode of [B, z, h, w] as one frame", got["sample"], diffusers_decode(vae, z))
    for frames, (h, w) in [(1, (36, 44)), (5, (24, 40)), (9, (16, 24))]:
        x = video(1, frames, h, w, seed=40 + frames)
        mean, std = diffusers_encode(vae, x)
        got, _ = forward(work, folder, "vae_encoder", {"image": x}, f"enc{frames}")
        if got is not None:
            compare(f"encode of {frames} frames {h}x{w} mean", got["mean"], mean)
            compare(f"encode of {frames} frames std", got["std"], std)
    z, x = latents(2, 2, 4, 5, seed=50), video(2, 5, 24, 32, seed=51)
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


def case_tiling(work):
    vae, folder = make_vae(work)
    z, x = latents(1, 2, 7, 9, seed=60), video(1, 5, 56, 72, seed=61)
    plain_dec, plain_mean = diffusers_decode(vae, z), diffusers_encode(vae, x)[0]
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                      tile_sample_stride_width=24)
    want_dec = diffusers_decode(vae, z)
    want_mean, want_std = diffusers_encode(vae, x)
    d, e = (want_dec - plain_dec).abs().max().item(), (want_mean - plain_mean).abs().max().item()
    H.check(d > 1e-3 and e > 1e-3, f"diffusers' tiled results differ from the untiled ones (decode {d:.3g}, "
            f"encode mean {e:.3g}): tiles really happened")
    mem = ("vae_tiling=true", "vae_tile_sample_size=32")
    dec1, _ = forward(work, folder, "vae_decoder", {"latents": z}, "dec_tiled", mem)
    enc, _ = forward(work, folder, "vae_encoder", {"image": x}, "enc_tiled", mem)
    if dec1 is not None:
        compare(f"tiled 32/24 decode {tuple(z.shape)}", dec1["sample"], want_dec)
    if enc is not None:
        compare(f"tiled 32/24 encode {tuple(x.shape)} mean", enc["mean"], want_mean)
        compare("tiled 32/24 encode std", enc["std"], want_std)
    # The decode split over the TP group: the same bits as tp 1.
    dec2, log = forward(work, folder, "vae_decoder", {"latents": z}, "dec_tiled_tp2", mem, np_=2)
    if dec1 is not None and dec2 is not None:
        H.check(torch.equal(dec1["sample"], dec2["sample"]),
                "one tiled video (6 tiles) decoded across tp 2 equals tp 1 bit for bit (max abs diff "
                f"{(dec1['sample'] - dec2['sample']).abs().max().item():.3g})")
        H.check("broadcast" in log, "the tp 2 decode broadcast its tiles: "
                + (re.search(r"broadcast[^|]*", log).group(0) if "broadcast" in log else log[-400:]))
    zb = latents(2, 2, 4, 5, seed=62)
    vae.disable_tiling()
    want_b = diffusers_decode(vae, zb)
    one, _ = forward(work, folder, "vae_decoder", {"latents": zb}, "dec_b_tp1", ("vae_slicing=true",))
    two, _ = forward(work, folder, "vae_decoder", {"latents": zb}, "dec_b_tp2", (), np_=2)
    if one is not None and two is not None:
        H.check(torch.equal(one["sample"], two["sample"]),
                "a batch of 2 videos decoded across tp 2 (one per rank) equals tp 1 (sliced) bit for bit")
        compare("a batch of 2 decoded across tp 2 vs diffusers", two["sample"], want_b)


def case_errors(work):
    _, good = make_vae(work)
    inp = os.path.join(work, "z.safetensors")
    save_file({"latents": latents(1, 2, 2, 2)}, inp)
    bad_cases = [
        ("is_residual", {"is_residual": True}, "Wan 2.2 TI2V-5B's residual VAE"),
        ("patch_size 2", {"patch_size": 2}, "'patch_size' is 2"),
        ("latents_mean length", {"latents_mean": [0.0] * 3}, "'latents_mean' has 3 entries but z_dim is 4"),
        ("one time step", {"temperal_downsample": [False, False, True]}, "'temperal_downsample' has 1 true"),
        ("scale_factor_spatial", {"scale_factor_spatial": 16}, "'scale_factor_spatial' is 16"),
    ]
    H.expect_config_refusals(work, good, inp, bad_cases)
    for label, comp, name, tensor, want in [
            ("latents of 5 channels", "vae_decoder", "latents", torch.zeros(1, 5, 2, 2, 2), "input 'z' must be"),
            ("a video of 4 frames", "vae_encoder", "image", torch.zeros(1, 3, 4, 16, 16), "has 4 frames")]:
        bad = os.path.join(work, f"{name}_bad.safetensors")
        save_file({name: tensor}, bad)
        rc, log = H.run(["forward", "--model", good, "--component", comp, "--inputs", bad, "--out",
                         os.path.join(work, f"{name}_bad_out.safetensors")], np_=2, timeout=120)
        H.check(rc == 6 and want in log, f"{label}: exit {rc} (want 6, '{want}')" + ("" if rc == 6 else f"\n{log[-600:]}"))


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {"frames": case_frames, "tiling": case_tiling, "errors": case_errors}, "tprun-wan-vae")


if __name__ == "__main__":
    sys.exit(main())
