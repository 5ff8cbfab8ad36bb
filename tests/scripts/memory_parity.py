#!/usr/bin/env python3
"""Memory features ([memory] / --memory) against the real diffusers and against the plain run.

Cases (one ctest entry each; `memory_parity.py TPRUN MPIRUN CASE`):
  vae_tiling   `tprun forward --component vae_decoder | vae_encoder --memory vae_tiling=true` vs
               diffusers' AutoencoderKL / AutoencoderKLFlux2 after enable_tiling(), on init-model VAEs
               whose config says sample_size 32 (so a 10x14 latent is 3 x 4 tiles and every blend
               runs; the last tiles are partial): within 1e-4, and visibly different from the
               untiled result (so tiles really happened). vae_tile_sample_size overrides the config.
  vae_slicing  a batch of 3 with --memory vae_slicing=true: equal to the plain decode / encode
               within 1e-5 and to diffusers' enable_slicing(); slicing + tiling together as well.
  attention    --memory attention_chunk=N (N not dividing the token count): the FLUX.1 and FLUX.2
               transformers' forward and a whole `tprun generate` within 1e-5 of the plain run, at
               tp 1 and 2.
  errors       one clear error on every rank, exit 3, nothing written: an unknown key, a key of a
               feature not built yet, a wrong type, an out-of-range value, a malformed setting,
               and the same keys in a manifest's [memory] table (file:line named).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness  # noqa: E402

TOL = 1e-4
EXACT_TOL = 1e-5
H = None  # tprun_harness.Harness, set in main()








def set_sample_size(folder, size):
    path = os.path.join(folder, "vae", "config.json")
    cfg = json.load(open(path))
    cfg["sample_size"] = size
    json.dump(cfg, open(path, "w"), indent=2)


def forward(work, folder, comp, inputs, tag, memory=(), np_=1):
    inp, out = os.path.join(work, f"{tag}_in.safetensors"), os.path.join(work, f"{tag}_out.safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, inp)
    args = ["forward", "--model", folder, "--component", comp, "--inputs", inp, "--out", out]
    for m in memory:
        args += ["--memory", m]
    rc, log = H.run(args, np_=np_)
    if not H.check(rc == 0, f"{tag}: forward ran" + ("" if rc == 0 else f": {log[-1200:]}")):
        return None
    return load_file(out)


def vae_class(folder):
    from diffusers import AutoencoderKL, AutoencoderKLFlux2
    cls = json.load(open(os.path.join(folder, "vae", "config.json")))["_class_name"]
    return AutoencoderKLFlux2 if cls == "AutoencoderKLFlux2" else AutoencoderKL


def vae_inputs(vae, batch, lh, lw):
    g = torch.Generator().manual_seed(7)
    sf = 2 ** (len(vae.config.block_out_channels) - 1)
    z = torch.randn(batch, vae.config.latent_channels, lh, lw, generator=g)
    x = torch.rand(batch, 3, lh * sf, lw * sf, generator=g) * 2 - 1
    return z, x


def diffusers_vae(vae, z, x):
    with torch.no_grad():
        dist = vae.encode(x).latent_dist
        return {"sample": vae.decode(z).sample, "mean": dist.mean, "std": dist.std}


def compare(tag, got, want, names, tol):
    for name in names:
        diff = (got[name] - want[name]).abs().max().item()
        H.check(diff <= tol, f"{tag} {name}: max abs diff {diff:.3g} (tolerance {tol})")


def tprun_vae(work, folder, z, x, tag, memory=()):
    dec = forward(work, folder, "vae_decoder", {"latents": z}, f"{tag}_dec", memory)
    enc = forward(work, folder, "vae_encoder", {"image": x}, f"{tag}_enc", memory)
    if dec is None or enc is None:
        return None
    return {"sample": dec["sample"], "mean": enc["mean"], "std": enc["std"]}


def case_vae_tiling(work):
    for arch in ("flux", "flux2-klein"):
        folder = H.init_model(work, arch)
        set_sample_size(folder, 32)
        vae = vae_class(folder).from_pretrained(os.path.join(folder, "vae")).eval()
        z, x = vae_inputs(vae, 1, 10, 14)
        plain = diffusers_vae(vae, z, x)
        vae.enable_tiling()
        tiled = diffusers_vae(vae, z, x)
        spread = (tiled["sample"] - plain["sample"]).abs().max().item()
        H.check(spread > 1e-3, f"{arch}: diffusers' tiled decode differs from its plain one by {spread:.3g} (tiles happen)")
        got = tprun_vae(work, folder, z, x, f"{arch}_tiled", ("vae_tiling=true",))
        if got is not None:
            compare(f"{arch} tiled vs diffusers enable_tiling()", got, tiled, ("sample", "mean", "std"), TOL)
        # vae_tile_sample_size overrides the config's sample_size: 16 px tiles (decode only: encoding
        # this image in 16 px tiles leaves a 4 px last tile, too small for the encoder's downsamplers,
        # in diffusers as in tprun).
        vae.tile_sample_min_size = 16
        vae.tile_latent_min_size = 16 // (2 ** (len(vae.config.block_out_channels) - 1))
        with torch.no_grad():
            small = vae.decode(z).sample
        got = forward(work, folder, "vae_decoder", {"latents": z}, f"{arch}_tiled16",
                      ("vae_tiling=true", "vae_tile_sample_size=16"))
        if got is not None:
            compare(f"{arch} 16 px tiles vs diffusers", got, {"sample": small}, ("sample",), TOL)
        # An image that fits one tile is decoded whole, exactly as without tiling.
        z1, x1 = vae_inputs(vae, 1, 4, 4)
        vae.disable_tiling()
        whole = diffusers_vae(vae, z1, x1)
        got = tprun_vae(work, folder, z1, x1, f"{arch}_onetile", ("vae_tiling=true",))
        if got is not None:
            compare(f"{arch} one tile (tiling off by size)", got, whole, ("sample", "mean", "std"), TOL)


def case_vae_slicing(work):
    folder = H.init_model(work, "flux")
    set_sample_size(folder, 32)
    vae = vae_class(folder).from_pretrained(os.path.join(folder, "vae")).eval()
    z, x = vae_inputs(vae, 3, 6, 6)
    plain = tprun_vae(work, folder, z, x, "plain")
    sliced = tprun_vae(work, folder, z, x, "sliced", ("vae_slicing=true",))
    vae.enable_slicing()
    want = diffusers_vae(vae, z, x)
    if plain is not None and sliced is not None:
        compare("sliced vs plain", sliced, plain, ("sample", "mean", "std"), EXACT_TOL)
        compare("sliced vs diffusers enable_slicing()", sliced, want, ("sample", "mean", "std"), TOL)
    z, x = vae_inputs(vae, 2, 10, 14)
    vae.enable_tiling()
    want = diffusers_vae(vae, z, x)
    both = tprun_vae(work, folder, z, x, "both", ("vae_slicing=true", "vae_tiling=true"))
    if both is not None:
        compare("sliced + tiled vs diffusers", both, want, ("sample", "mean", "std"), TOL)


def case_attention(work):
    # The transformer parity fixtures of the FLUX.1 and FLUX.2 tests: any registered class.
    for arch in ("flux", "flux2-klein"):
        folder = H.init_model(work, arch)
        for tp in (1, 2):
            out = {}
            for tag, memory in (("plain", ()), ("chunked", ("attention_chunk=7",))):
                png = os.path.join(work, f"{arch}_{tag}_tp{tp}.png")
                tensors = os.path.join(work, f"{arch}_{tag}_tp{tp}.safetensors")
                args = ["generate", "--model", folder, "--prompt", "a lighthouse at dusk", "--height", "64",
                        "--width", "64", "--steps", "2", "--seed", "3", "--out", png, "--out-tensors", tensors]
                for m in memory:
                    args += ["--memory", m]
                rc, log = H.run(args, np_=tp)
                if H.check(rc == 0, f"{arch} tp {tp} generate {tag} ran" + ("" if rc == 0 else f": {log[-1200:]}")):
                    out[tag] = load_file(tensors)
                    if memory:
                        H.check("chunks of 7" in log, f"{arch} tp {tp}: the log names the chunked attention")
            if len(out) == 2:
                for name in ("latents", "image"):
                    diff = (out["chunked"][name] - out["plain"][name]).abs().max().item()
                    H.check(diff <= EXACT_TOL, f"{arch} tp {tp} attention_chunk=7 vs plain {name}: {diff:.3g}")


def expect_error(label, args, want, np_=2):
    rc, log = H.run(args, np_=np_, timeout=120)
    lines = [l for l in log.splitlines() if want in l]
    H.check(rc == 3 and len(lines) >= np_, f"{label}: exit {rc} (want 3), '{want}' on {len(lines)} of {np_} ranks")


def case_errors(work):
    folder = H.init_model(work, "flux")
    base = ["generate", "--model", folder, "--prompt", "x", "--height", "64", "--width", "64", "--steps", "1",
            "--out", os.path.join(work, "never.png")]
    expect_error("unknown key", base + ["--memory", "vae_tilling=true"], "--memory vae_tilling: unknown key")
    expect_error("not built", base + ["--memory", 'offload={type="block_level"}'],
                 "--memory offload: not built yet")
    expect_error("wrong type", base + ["--memory", "vae_tiling=3"], "--memory vae_tiling: must be true or false")
    expect_error("range", base + ["--memory", "attention_chunk=-2"], "--memory attention_chunk: -2 is outside")
    expect_error("malformed", base + ["--memory", "vae_tiling"], "expected KEY=VALUE")
    expect_error("tile size", base + ["--memory", "vae_tile_sample_size=4"],
                 "--memory vae_tile_sample_size: 4 is outside")
    H.check(not os.path.exists(os.path.join(work, "never.png")), "no image written by any refused run")
    # The manifest's [memory] table: file:line and key.
    with open(os.path.join(work, "prompts.jsonl"), "w") as f:
        f.write('{"id": "a", "prompt": "x"}\n')
    manifest = os.path.join(work, "job.toml")
    with open(manifest, "w") as f:
        f.write(f'model = "{folder}"\nrequests = "prompts.jsonl"\n[memory]\nvae_tiling = true\n'
                'layerwise_casting = { storage = "float8_e4m3fn" }\n[output]\ndir = "out"\n')
    expect_error("manifest not built", ["run", manifest], "job.toml:5: memory.layerwise_casting: not built yet")
    H.check(not os.path.exists(os.path.join(work, "out", "results.jsonl")), "no results written by the refused job")


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    case = sys.argv[3]
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix=f"tprun-memory-{case}-")
    try:
        {"vae_tiling": case_vae_tiling, "vae_slicing": case_vae_slicing, "attention": case_attention,
         "errors": case_errors}[case](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'FAILED' if H.failures else 'OK'}: {H.failures} failure(s)")
    return 1 if H.failures else 0


if __name__ == "__main__":
    sys.exit(main())
