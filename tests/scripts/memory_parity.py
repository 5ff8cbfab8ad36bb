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
  layerwise_casting
               --memory 'layerwise_casting={storage="float8_e4m3fn"}' (and float8_e5m2) on init-model
               FLUX.1, FLUX.2 and Qwen-Image transformers and the FLUX.1 VAE decoder vs diffusers'
               enable_layerwise_casting(storage_dtype, compute_dtype=torch.float32) on the same
               weights and inputs: within 1e-5; the same layers cast (tprun's stored weight bytes
               equal the bytes of diffusers' parameters after enabling, fp8 ones at 1 byte); the
               difference against no casting reported and bounded (CAST_TOL, relative to the
               output's largest magnitude); user skip patterns replace diffusers' defaults (the
               class's own patterns stay); `tprun verify --tp 2` with fp8 storage passes.
  errors       one clear error on every rank, exit 3, nothing written: an unknown key, a wrong type, an out-of-range value, a malformed setting,
               a layerwise_casting skip pattern that is not a regex or an unknown storage dtype,
               and the same keys in a manifest's [memory] table (file:line named).
"""
import re
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, run_cases, transformer_inputs  # noqa: E402

TOL = 1e-4
EXACT_TOL = 1e-5
# fp8 storage against full precision, as a fraction of the output's largest magnitude (init-model
# weights; measured: see case_layerwise_casting's printout).
CAST_TOL = {"float8_e4m3fn": 0.15, "float8_e5m2": 0.3}
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


def diffusers_model(folder, arch, comp):
    from diffusers import FluxTransformer2DModel, Flux2Transformer2DModel, QwenImageTransformer2DModel
    if comp == "vae_decoder":
        return vae_class(folder).from_pretrained(os.path.join(folder, "vae")).eval()
    cls = {"flux": FluxTransformer2DModel, "qwen-image": QwenImageTransformer2DModel}.get(arch, Flux2Transformer2DModel)
    return cls.from_pretrained(os.path.join(folder, "transformer")).eval()


def diffusers_run(model, comp, inputs):
    with torch.no_grad():
        if comp == "vae_decoder":
            return model.decode(inputs["latents"]).sample
        if "img_shapes" in inputs:  # diffusers takes Qwen-Image's img_shapes as [[(frames, h, w)]] per sample
            inputs = dict(inputs, img_shapes=[[tuple(int(v) for v in row)] for row in inputs["img_shapes"]])
        return model(**inputs, return_dict=False)[0]


def cast_modules(model):
    """The modules diffusers' enable_layerwise_casting hooked."""
    return sorted(n for n, m in model.named_modules()
                  if getattr(m, "_diffusers_hook", None) is not None and m._diffusers_hook.get_hook("layerwise_casting"))


def param_bytes(model, prefix=""):
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n.startswith(prefix))


def stored_bytes(log):
    m = re.search(r"stored (\d+) bytes", log)
    return int(m.group(1)) if m else None


def forward_log(work, folder, comp, inputs, tag, memory=(), np_=1):
    inp, out = os.path.join(work, f"{tag}_in.safetensors"), os.path.join(work, f"{tag}_out.safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, inp)
    args = ["forward", "--model", folder, "--component", comp, "--inputs", inp, "--out", out, "--tp", str(np_)]
    for m in memory:
        args += ["--memory", m]
    rc, log = H.run(args, np_=np_)
    if not H.check(rc == 0, f"{tag}: forward ran" + ("" if rc == 0 else f": {log[-1500:]}")):
        return None, log
    return load_file(out), log


def case_layerwise_casting(work):
    cases = [("flux", "transformer"), ("flux2-klein", "transformer"), ("qwen-image", "transformer"),
             ("flux", "vae_decoder")]
    folders = {}
    for arch, comp in cases:
        if arch not in folders:
            folders[arch] = H.init_model(work, arch)
        folder = folders[arch]
        if comp == "vae_decoder":
            vae = diffusers_model(folder, arch, comp)
            g = torch.Generator().manual_seed(5)
            inputs = {"latents": torch.randn(1, vae.config.latent_channels, 6, 6, generator=g)}
            out_name, bytes_prefix = "sample", ("decoder.", "post_quant_conv.")  # the half tprun loads
        else:
            inputs = transformer_inputs(folder, arch)
            out_name, bytes_prefix = "sample", ""
        tag = f"{arch}_{comp}"
        plain_model = diffusers_model(folder, arch, comp)
        plain = diffusers_run(plain_model, comp, inputs)
        scale = plain.abs().max().item()
        got_plain, log_plain = forward_log(work, folder, comp, inputs, f"{tag}_plain")
        if got_plain is not None:
            diff = (got_plain[out_name] - plain).abs().max().item()
            H.check(diff <= EXACT_TOL, f"{tag} plain vs diffusers: {diff:.3g}")
        plain_stored = stored_bytes(log_plain)
        for storage in ("float8_e4m3fn", "float8_e5m2"):
            model = diffusers_model(folder, arch, comp)
            model.enable_layerwise_casting(storage_dtype=getattr(torch, storage), compute_dtype=torch.float32)
            want = diffusers_run(model, comp, inputs)
            spread = (want - plain).abs().max().item()
            print(f"     {tag} {storage}: {len(cast_modules(model))} modules cast by diffusers; "
                  f"diffusers cast vs no cast: max abs {spread:.3g}, output max {scale:.3g}, "
                  f"relative {spread / scale:.3g}", flush=True)
            got, log = forward_log(work, folder, comp, inputs, f"{tag}_{storage}",
                                   (f'layerwise_casting={{storage="{storage}"}}',))
            if got is None:
                continue
            diff = (got[out_name] - want).abs().max().item()
            H.check(diff <= EXACT_TOL, f"{tag} {storage} vs diffusers enable_layerwise_casting: {diff:.3g}")
            off = (got[out_name] - plain).abs().max().item()
            H.check(0 < off <= CAST_TOL[storage] * scale,
                    f"{tag} {storage} vs no casting: max abs {off:.3g} = {off / scale:.3g} of the output's max "
                    f"(bound {CAST_TOL[storage]})")
            H.check(f"layerwise_casting (Linear/Conv/Embedding weights stored in {storage}" in log,
                    f"{tag} {storage}: the log names the feature")
            cast_params = sum(len(list(dict(model.named_modules())[n].parameters())) for n in cast_modules(model)
                              if n.startswith(bytes_prefix))
            m = re.search(r"(\d+) tensors \(Linear / Conv / Embedding weights and biases\) stored in " + storage, log)
            H.check(m is not None and int(m.group(1)) == cast_params,
                    f"{tag} {storage}: the load logs {m.group(1) if m else '?'} tensors cast, diffusers casts "
                    f"{cast_params} parameters")
            stored = stored_bytes(log)
            if bytes_prefix is not None:
                H.check(stored == param_bytes(model, bytes_prefix),
                        f"{tag} {storage}: tprun keeps {stored} weight bytes, diffusers' cast model "
                        f"{param_bytes(model, bytes_prefix)} (same layers cast)")
            if stored is not None and plain_stored:
                H.check(stored < plain_stored * 0.5,
                        f"{tag} {storage}: stored weight bytes {plain_stored} -> {stored} "
                        f"({plain_stored / stored:.2f}x smaller)")
    # User patterns replace diffusers' defaults; the class's own ("pos_embed", "norm") stay.
    folder = folders["flux"]
    inputs = transformer_inputs(folder, "flux")
    model = diffusers_model(folder, "flux", "transformer")
    skip = ["^x_embedder$", "ff_context"]
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32,
                                   skip_modules_pattern=tuple(skip))
    want = diffusers_run(model, "transformer", inputs)
    mods = cast_modules(model)
    H.check("proj_out" in mods and "x_embedder" not in mods and not any("norm" in m for m in mods),
            "diffusers with user patterns: proj_out cast, x_embedder and norms kept")
    memory = 'layerwise_casting={storage="float8_e4m3fn", skip=["^x_embedder$", "ff_context"]}'
    got, log = forward_log(work, folder, "transformer", inputs, "flux_userskip", (memory,))
    if got is not None:
        diff = (got["sample"] - want).abs().max().item()
        H.check(diff <= EXACT_TOL, f"flux user skip patterns vs diffusers: {diff:.3g}")
        H.check(stored_bytes(log) == param_bytes(model), f"flux user skip: stored bytes {stored_bytes(log)} "
                f"== diffusers' {param_bytes(model)}")
    # TP: each rank casts its own slices; verify compares tp 2 against tp 1, both cast.
    for arch in ("flux", "flux2-klein"):
        rc, log = H.run(["verify", "--model", folders[arch], "--component", "transformer", "--tp", "2",
                         "--memory", 'layerwise_casting={storage="float8_e4m3fn"}'], np_=2)
        H.check(rc == 0 and "OK: max abs diff" in log,
                f"{arch} verify tp 2 with fp8 storage" + ("" if rc == 0 else f": {log[-1500:]}"))
    # tp 2 forward equals diffusers' cast model too.
    inputs = transformer_inputs(folder, "flux")
    model = diffusers_model(folder, "flux", "transformer")
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    want = diffusers_run(model, "transformer", inputs)
    got, log = forward_log(work, folder, "transformer", inputs, "flux_tp2",
                           ('layerwise_casting={storage="float8_e4m3fn"}',), np_=2)
    if got is not None:
        diff = (got["sample"] - want).abs().max().item()
        H.check(diff <= EXACT_TOL, f"flux tp 2 fp8 vs diffusers enable_layerwise_casting: {diff:.3g}")


def expect_error(label, args, want, np_=2):
    H.expect_config_error(label, args, want, np_)


def case_errors(work):
    folder = H.init_model(work, "flux")
    base = ["generate", "--model", folder, "--prompt", "x", "--height", "64", "--width", "64", "--steps", "1",
            "--out", os.path.join(work, "never.png")]
    expect_error("unknown key", base + ["--memory", "vae_tilling=true"], "--memory vae_tilling: unknown key")
    expect_error("wrong type", base + ["--memory", "vae_tiling=3"], "--memory vae_tiling: must be true or false")
    expect_error("range", base + ["--memory", "attention_chunk=-2"], "--memory attention_chunk: -2 is outside")
    expect_error("malformed", base + ["--memory", "vae_tiling"], "expected KEY=VALUE")
    expect_error("tile size", base + ["--memory", "vae_tile_sample_size=4"],
                 "--memory vae_tile_sample_size: 4 is outside")
    expect_error("not a regex", base + ["--memory", 'layerwise_casting={storage="float8_e4m3fn", skip=["(unclosed"]}'],
                 "--memory layerwise_casting.skip: '(unclosed' is not a regular expression")
    expect_error("storage dtype", base + ["--memory", 'layerwise_casting={storage="float8_e3m4"}'],
                 "--memory layerwise_casting.storage: 'float8_e3m4' is not one of float8_e4m3fn, float8_e5m2")
    expect_error("storage missing", base + ["--memory", 'layerwise_casting={skip=["norm"]}'],
                 "--memory layerwise_casting.storage: required key is missing")
    expect_error("casting unknown key", base + ["--memory", 'layerwise_casting={storage="float8_e5m2", dtype=1}'],
                 "--memory layerwise_casting.dtype: unknown key")
    expect_error("casting not a table", base + ["--memory", "layerwise_casting=true"],
                 "--memory layerwise_casting: must be a table")
    H.check(not os.path.exists(os.path.join(work, "never.png")), "no image written by any refused run")
    # The manifest's [memory] table: file:line and key.
    with open(os.path.join(work, "prompts.jsonl"), "w") as f:
        f.write('{"id": "a", "prompt": "x"}\n')
    manifest = os.path.join(work, "job.toml")
    def write_manifest(line):
        with open(manifest, "w") as f:
            f.write(f'model = "{folder}"\nrequests = "prompts.jsonl"\n[memory]\nvae_tiling = true\n'
                    f'{line}\n[output]\ndir = "out"\n')
    write_manifest('attention_chunk = -1')
    expect_error("manifest range", ["run", manifest], "job.toml:5: memory.attention_chunk: -1 is outside")
    write_manifest('layerwise_casting = { storage = "float8_e4m3fn", skip = ["norm", "(unclosed"] }')
    expect_error("manifest not a regex", ["run", manifest],
                 "job.toml:5: memory.layerwise_casting.skip: '(unclosed' is not a regular expression")
    write_manifest('layerwise_casting = { storage = "fp8" }')
    expect_error("manifest storage dtype", ["run", manifest],
                 "job.toml:5: memory.layerwise_casting.storage: 'fp8' is not one of float8_e4m3fn, float8_e5m2")
    H.check(not os.path.exists(os.path.join(work, "out", "results.jsonl")), "no results written by the refused job")


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {"vae_tiling": case_vae_tiling, "vae_slicing": case_vae_slicing, "attention": case_attention,
                            "layerwise_casting": case_layerwise_casting, "errors": case_errors}, "tprun-memory")


if __name__ == "__main__":
    sys.exit(main())
