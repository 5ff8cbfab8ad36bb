#!/usr/bin/env python3
"""Parity of `tprun forward` with diffusers' own FluxTransformer2DModel forward.

For each config, builds the model with diffusers at test time (fp32, CPU),
re-initialises every parameter with seeded random values (diffusers
zero-initialises some layers, which would hide bugs there), saves it with
save_pretrained, makes inputs as FluxPipeline does (packed latents, text embeddings, pooled projection,
timestep t/1000, img_ids (0, row, col), zero txt_ids, guidance 3.5), runs
diffusers' forward, then `tprun forward` under mpirun at tp 1, 2 (and 4 where
the heads allow, small configs only) and compares `sample`.

Tolerances: the small configs are held to 1e-4 absolute (measured: ~1e-6).
The FLUX.1-width config (hidden 3072, 24 heads x 128, joint_attention_dim
4096) sums 3072..15360-wide dot products in fp32 whose order differs between
diffusers' and tprun's kernels and between TP slices (partial sums reduced
across ranks), so its rounding noise grows with width and with the output's
scale; it is held to 5e-5 x max|sample| (about 2e-4 here; measured ~2e-6, i.e.
~5e-7 relative, so 100x headroom for other BLAS/oneDNN builds). A real bug is
far above that: a 1e-4 change of the timestep moves the output by ~8e-2,
swapped RoPE axes by ~0.4.

usage: flux_forward_parity.py TPRUN MPIRUN
"""
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file, save_file

SMALL_TOL = 1e-4
WIDE_REL_TOL = 5e-5

CONFIGS = [
    dict(name="small_guidance",
         cfg=dict(num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4, in_channels=16,
                  joint_attention_dim=32, pooled_projection_dim=24, guidance_embeds=True, axes_dims_rope=(4, 6, 6)),
         grid=(8, 8), txt=7, tps=(1, 2, 4), wide=False),
    # patch_size 2: x_embedder is Linear(in_channels, inner) on already-packed
    # tokens (in_channels features per token, as FluxPipeline packs 2x2 patches);
    # proj_out emits patch_size^2 * out_channels = 16 per token.
    dict(name="patch2_noguidance",
         cfg=dict(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=6, in_channels=8,
                  joint_attention_dim=16, pooled_projection_dim=12, guidance_embeds=False, axes_dims_rope=(2, 2, 4),
                  patch_size=2, out_channels=4),
         grid=(4, 6), txt=5, tps=(1, 2), wide=False),  # 6 heads: tp 4 does not divide
    # One block of each kind at FLUX.1's real width (~545M parameters, 2.2 GB fp32).
    dict(name="flux1_width",
         cfg=dict(num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=24, in_channels=64,
                  joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                  axes_dims_rope=(16, 56, 56)),
         grid=(4, 4), txt=8, tps=(1, 2), wide=True),
]


def build_model(cfg, seed):
    """diffusers' class with every parameter re-drawn from a seeded generator."""
    torch.manual_seed(seed)
    # Meta device, then to_empty: skips diffusers' default init (slow at 3072
    # width); every parameter is overwritten below and the model has no buffers.
    with torch.device("meta"):
        model = FluxTransformer2DModel(**cfg)
    model = model.to_empty(device="cpu")
    assert not list(model.buffers()), "unexpected buffers (would stay uninitialised)"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif p.ndim >= 2:
                std = min(max(1.0 / math.sqrt(p.shape[1]), 0.02), 0.2)
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:  # RMSNorm weights (norm_q/k, norm_added_q/k)
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def make_inputs(cfg, grid, txt, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    h, w = grid
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    inputs = {
        "hidden_states": torch.randn(1, h * w, cfg["in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(1, txt, cfg["joint_attention_dim"], generator=g),
        "pooled_projections": torch.randn(1, cfg["pooled_projection_dim"], generator=g),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids.reshape(h * w, 3),
        "txt_ids": torch.zeros(txt, 3),
    }
    if cfg.get("guidance_embeds"):
        inputs["guidance"] = torch.tensor([3.5])
    return {k: v.to(torch.float32).contiguous() for k, v in inputs.items()}


def run_tprun(tprun, mpirun, model_dir, inputs_path, out_path, tp, timeout):
    cmd = [mpirun, "--oversubscribe", "-np", str(tp), tprun, "forward", "--model", model_dir, "--inputs", inputs_path,
           "--out", out_path, "--tp", str(tp), "--log-dir", ""]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s"
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {(r.stdout + r.stderr)[-2000:]}"
    return load_file(out_path)["sample"], None


def main():
    tprun, mpirun = sys.argv[1], sys.argv[2]
    failures = 0
    t_start = time.time()
    for i, case in enumerate(CONFIGS):
        cfg, name = case["cfg"], case["name"]
        t0 = time.time()
        work = tempfile.mkdtemp(prefix=f"tprun_fwd_{name}_")
        try:
            model = build_model(cfg, seed=i)
            model_dir = os.path.join(work, "model")
            model.save_pretrained(model_dir)
            inputs = make_inputs(cfg, case["grid"], case["txt"], seed=i)
            inputs_path = os.path.join(work, "inputs.safetensors")
            save_file(inputs, inputs_path)
            with torch.no_grad():
                expected = model(**inputs, return_dict=False)[0]
            del model
            p = cfg.get("patch_size", 1)
            out_ch = cfg.get("out_channels") or cfg["in_channels"]
            assert expected.shape == (1, inputs["hidden_states"].shape[1], p * p * out_ch), expected.shape
            scale = expected.abs().max().item()
            tol = WIDE_REL_TOL * scale if case["wide"] else SMALL_TOL
            for tp in case["tps"]:
                out_path = os.path.join(work, f"out_tp{tp}.safetensors")
                sample, err = run_tprun(tprun, mpirun, model_dir, inputs_path, out_path, tp,
                                        timeout=300 if case["wide"] else 120)
                if err is not None:
                    print(f"FAIL {name} tp {tp}: tprun forward {err}")
                    failures += 1
                    continue
                if sample.shape != expected.shape:
                    print(f"FAIL {name} tp {tp}: shape {list(sample.shape)} vs diffusers {list(expected.shape)}")
                    failures += 1
                    continue
                diff = (sample.float() - expected).abs()
                dmax, dmean = diff.max().item(), diff.mean().item()
                ok = math.isfinite(dmax) and dmax <= tol
                failures += 0 if ok else 1
                print(f"{'ok  ' if ok else 'FAIL'} {name} tp {tp}: max abs diff {dmax:.3g}, mean abs diff {dmean:.3g}"
                      f" (tolerance {tol:.3g}; max|sample| {scale:.3g})", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"  {name}: {time.time() - t0:.1f}s", flush=True)
    print(f"{'FAILED' if failures else 'OK'}: {failures} failures ({time.time() - t_start:.1f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
