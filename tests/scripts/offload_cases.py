#!/usr/bin/env python3
"""Group offload and device maps ([memory] offload / device_map / max_memory / offload_folder).

Cases (one ctest entry each; `offload_cases.py TPRUN MPIRUN CASE`):
  offload      `tprun forward` of init-model FLUX.1 and FLUX.2 [klein] transformers with block-level
               (1 and 2 blocks per group), leaf-level and model-level offload, to cpu and to disk,
               with and without prefetch, and with fp8 storage: equal to the plain forward within
               1e-5 (fp32); on a CPU rank to = "cpu" logs that there is nothing to move; the logs
               name the groups. A whole `tprun generate` with disk offload equal to the plain one at
               tp 1 and 2; `tprun verify --tp 2` passes with disk offload and with fp8 + disk.
  disk_reuse   a second run reuses the group files (not read again, same output); a folder written
               from other weights (another checkpoint copied over the first) is detected and
               rewritten, and its output is the new weights' output; a truncated group file is
               rewritten too.
  device_map   an explicit map (a component and single blocks on "disk", a component on "cpu")
               and "balanced" under a small max_memory (components spill to disk, the map logged in
               hf_device_map form): generate equal to the plain run; a component-relative map for
               `tprun forward`.
  errors       one clear error on every rank, exit 3, before any weight is read: unknown and
               malformed offload keys, to = "disk" without disk_path, a disk path that cannot be
               written, a device map naming a module or component that does not exist, a device
               map with tp 2, "balanced" for one component, max_memory without "balanced".
"""
import glob
import json
import os
import re
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, run_cases, transformer_inputs  # noqa: E402

EXACT_TOL = 1e-5
H = None


def forward(work, folder, inputs, tag, memory=(), np_=1, comp="transformer"):
    inp, out = os.path.join(work, f"{tag}_in.safetensors"), os.path.join(work, f"{tag}_out.safetensors")
    save_file(inputs, inp)
    args = ["forward", "--model", folder, "--component", comp, "--inputs", inp, "--out", out, "--tp", str(np_)]
    for m in memory:
        args += ["--memory", m]
    rc, log = H.run(args, np_=np_)
    if not H.check(rc == 0, f"{tag}: forward ran" + ("" if rc == 0 else f": {log[-1500:]}")):
        return None, log
    return load_file(out)["sample"], log


def generate(work, folder, tag, memory=(), np_=1):
    png, tensors = os.path.join(work, f"{tag}.png"), os.path.join(work, f"{tag}.safetensors")
    args = ["generate", "--model", folder, "--prompt", "a red bicycle", "--height", "64", "--width", "64",
            "--steps", "2", "--seed", "9", "--out", png, "--out-tensors", tensors]
    for m in memory:
        args += ["--memory", m]
    rc, log = H.run(args, np_=np_)
    if not H.check(rc == 0, f"{tag}: generate ran" + ("" if rc == 0 else f": {log[-1500:]}")):
        return None, log
    return load_file(tensors), log


def same(tag, got, want):
    if got is None or want is None:
        return
    diff = (got - want).abs().max().item()
    H.check(diff <= EXACT_TOL, f"{tag}: max |diff| {diff:.3g} (<= {EXACT_TOL})")


def groups_logged(log):
    m = re.search(r"(\d+) of (\d+) tensors in (\d+) offload groups", log)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def offload(kind, to, disk=None, per_group=None, prefetch=None):
    parts = [f'type="{kind}"', f'to="{to}"']
    if disk:
        parts.append(f'disk_path="{disk}"')
    if per_group:
        parts.append(f"blocks_per_group={per_group}")
    if prefetch is not None:
        parts.append(f"prefetch={'true' if prefetch else 'false'}")
    return "offload={" + ", ".join(parts) + "}"


def case_offload(work):
    for arch in ("flux", "flux2-klein"):
        folder = H.init_model(work, arch)
        inputs = transformer_inputs(folder, arch)
        plain, _ = forward(work, folder, inputs, f"{arch}_plain")
        disk = os.path.join(work, f"disk_{arch}")
        variants = [
            ("block cpu", offload("block_level", "cpu")),
            ("block disk", offload("block_level", "disk", disk)),
            ("block disk prefetch", offload("block_level", "disk", disk, prefetch=True)),
            ("block 2/group disk prefetch", offload("block_level", "disk", disk + "2", per_group=2, prefetch=True)),
            ("leaf disk", offload("leaf_level", "disk", disk + "leaf")),
            ("leaf disk prefetch", offload("leaf_level", "disk", disk + "leaf", prefetch=True)),
            ("model disk", offload("model_level", "disk", disk + "model")),
            ("sequential", 'offload="sequential"'),
        ]
        counts = {}
        for label, setting in variants:
            got, log = forward(work, folder, inputs, f"{arch}_{label.replace(' ', '_').replace('/', '_')}", (setting,))
            same(f"{arch} {label} vs plain", got, plain)
            if 'to="cpu"' in setting or "sequential" in setting:
                H.check("nothing to move" in log, f"{arch} {label}: the log says to = cpu has nothing to do on a CPU rank")
            else:
                g = groups_logged(log)
                H.check(g is not None and g[0] == g[1], f"{arch} {label}: every tensor offloaded ({g})")
                counts[label] = g[2] if g else None
        cfg = json.load(open(os.path.join(folder, "transformer", "config.json")))
        blocks = cfg["num_layers"] + cfg["num_single_layers"]
        H.check(counts.get("block disk") == blocks + 1,
                f"{arch}: block level makes one group per block + the top level ({counts.get('block disk')}, "
                f"want {blocks + 1})")
        H.check(counts.get("model disk") == 1, f"{arch}: model level is one group")
        H.check((counts.get("leaf disk") or 0) > blocks * 4, f"{arch}: leaf level has one group per layer")
        # fp8 storage with disk offload: the same as fp8 alone.
        fp8 = 'layerwise_casting={storage="float8_e4m3fn"}'
        cast, _ = forward(work, folder, inputs, f"{arch}_fp8", (fp8,))
        both, _ = forward(work, folder, inputs, f"{arch}_fp8_disk", (fp8, offload("block_level", "disk", disk + "fp8", prefetch=True)))
        same(f"{arch} fp8 + disk offload vs fp8", both, cast)
        files = glob.glob(os.path.join(disk + "fp8", "*", "tp0of1", "*.safetensors"))
        H.check(files and any(v.dtype == torch.float8_e4m3fn for f in files for v in load_file(f).values()),
                f"{arch}: fp8 + disk offload files hold fp8 weights")

    folder = os.path.join(work, "flux")
    for tp in (1, 2):
        plain, _ = generate(work, folder, f"gen_plain_tp{tp}", np_=tp)
        got, log = generate(work, folder, f"gen_disk_tp{tp}",
                            (offload("block_level", "disk", os.path.join(work, "gen_disk"), prefetch=True),), np_=tp)
        if plain is not None and got is not None:
            for name in ("latents", "image"):
                same(f"generate tp {tp} disk offload {name}", got[name], plain[name])
        slices = sorted(os.path.basename(p) for p in glob.glob(os.path.join(work, "gen_disk", "*", f"tp*of{tp}")))
        H.check(set(slices) == {f"tp{r}of{tp}" for r in range(tp)},
                f"generate tp {tp}: each TP rank keeps its own slices on disk ({slices})")
    for label, memory in (("disk", (offload("block_level", "disk", os.path.join(work, "verify_disk")),)),
                          ("fp8 + disk", ('layerwise_casting={storage="float8_e4m3fn"}',
                                          offload("leaf_level", "disk", os.path.join(work, "verify_fp8"), prefetch=True)))):
        args = ["verify", "--model", folder, "--component", "transformer", "--tp", "2"]
        for m in memory:
            args += ["--memory", m]
        rc, log = H.run(args, np_=2)
        H.check(rc == 0, f"verify --tp 2 with {label} offload passes" + ("" if rc == 0 else f": {log[-1500:]}"))


def case_disk_reuse(work):
    folder = H.init_model(work, "flux")
    inputs = transformer_inputs(folder, "flux")
    disk = os.path.join(work, "disk")
    setting = offload("block_level", "disk", disk, prefetch=True)
    plain, _ = forward(work, folder, inputs, "plain")
    first, log1 = forward(work, folder, inputs, "first", (setting,))
    same("first disk run vs plain", first, plain)
    second, log2 = forward(work, folder, inputs, "second", (setting,))
    same("second disk run (files reused) vs plain", second, plain)
    H.check("reused from disk, not read again" in log2 and "reused from disk" not in log1,
            "the second run reuses the group files; the first writes them")
    # Other weights at the same path: detected and rewritten, never reused.
    other = H.init_model(work, "flux", name="other")
    subprocess_seed(other)
    for f in glob.glob(os.path.join(other, "transformer", "*")):
        shutil.copy(f, os.path.join(folder, "transformer", os.path.basename(f)))
    want, _ = forward(work, other, inputs, "other_plain")
    got, log3 = forward(work, folder, inputs, "third", (setting,))
    H.check("rewriting it" in log3 and "reused from disk" not in log3,
            "a folder written from other weights is detected and rewritten")
    same("after other weights: the new weights' output", got, want)
    H.check(want is not None and plain is not None and (want - plain).abs().max().item() > 1e-3,
            "the other weights really give another output")
    # A truncated group file is rewritten too.
    files = sorted(glob.glob(os.path.join(disk, "*", "tp0of1", "*.safetensors")))
    with open(files[0], "r+b") as f:
        f.truncate(100)
    got, log4 = forward(work, folder, inputs, "fourth", (setting,))
    H.check("rewriting it" in log4, "a truncated group file is rewritten")
    same("after a truncated file", got, want)


def subprocess_seed(folder):
    """Re-initialise `folder` with another seed (other weights, same shapes)."""
    import subprocess
    r = subprocess.run([H.tprun, "init-model", folder, "--arch", "flux", "--seed", "7", "--force"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"init-model --seed 7 failed: {r.stderr}")


def case_device_map(work):
    folder = H.init_model(work, "flux")
    plain, _ = generate(work, folder, "plain")
    spill = os.path.join(work, "spill")
    explicit = ('device_map={"transformer.single_transformer_blocks.0" = "disk", '
                '"transformer.transformer_blocks.0" = "disk", "text_encoder_2" = "disk", "vae" = "cpu"}')
    got, log = generate(work, folder, "explicit", (explicit, f'offload_folder="{spill}"'))
    if plain is not None and got is not None:
        for name in ("latents", "image"):
            same(f"explicit device map {name}", got[name], plain[name])
    m = re.search(r"hf_device_map (\{.*?\})", log)
    want = {"transformer.single_transformer_blocks.0": "disk", "transformer.transformer_blocks.0": "disk",
            "text_encoder_2": "disk", "vae": "cpu"}
    H.check(m is not None and json.loads(m.group(1)) == want, "the map is logged in hf_device_map form")
    H.check(len(glob.glob(os.path.join(spill, "*", "tp0of1", "*.safetensors"))) >= 3,
            "the disk entries' groups are written under offload_folder")
    got, log = generate(work, folder, "balanced", ('device_map="balanced"', 'max_memory={cpu="1MB"}',
                                                    f'offload_folder="{spill}b"'))
    if plain is not None and got is not None:
        for name in ("latents", "image"):
            same(f"balanced device map (spilling to disk) {name}", got[name], plain[name])
    m = re.search(r"hf_device_map (\{.*?\})", log)
    placed = json.loads(m.group(1)) if m else {}
    H.check(placed and "disk" in placed.values() and "cpu" in placed.values(),
            f"balanced under max_memory cpu=1MB puts the largest components on disk, the small ones on cpu: {placed}")
    # A component-relative map for one component.
    inputs = transformer_inputs(folder, "flux")
    base, _ = forward(work, folder, inputs, "fw_plain")
    got, log = forward(work, folder, inputs, "fw_map", ('device_map={"single_transformer_blocks" = "disk"}',
                                                        f'offload_folder="{spill}f"'))
    same("forward with a component-relative device map", got, base)
    g = groups_logged(log)
    cfg = json.load(open(os.path.join(folder, "transformer", "config.json")))
    H.check(g is not None and g[2] == cfg["num_single_layers"], f"only the single blocks are offloaded ({g})")


def expect_error(label, args, want, np_=2):
    H.expect_config_error(label, args, want, np_, absent="offload groups")


def case_errors(work):
    folder = H.init_model(work, "flux")
    out = os.path.join(work, "never.png")
    base = ["generate", "--model", folder, "--prompt", "x", "--height", "64", "--width", "64", "--steps", "1",
            "--out", out]
    blocker = os.path.join(work, "a_file")
    open(blocker, "w").write("x")
    expect_error("offload unknown key", base + ["--memory", 'offload={type="block_level", blocks=2}'],
                 "--memory offload.blocks: unknown key")
    expect_error("offload type", base + ["--memory", 'offload={type="layer_level"}'],
                 "--memory offload.type: 'layer_level' is not one of block_level, leaf_level, model_level")
    expect_error("offload shorthand", base + ["--memory", 'offload="everything"'],
                 "--memory offload: 'everything' is not \"model\" or \"sequential\"")
    expect_error("disk without path", base + ["--memory", 'offload={type="block_level", to="disk"}'],
                 "--memory offload.disk_path: required when to = \"disk\"")
    expect_error("blocks_per_group", base + ["--memory", 'offload={type="block_level", blocks_per_group=0}'],
                 "--memory offload.blocks_per_group: 0 is outside")
    expect_error("disk path not writable",
                 base + ["--memory", f'offload={{type="block_level", to="disk", disk_path="{blocker}/sub"}}'],
                 "memory.offload.disk_path: cannot create")
    expect_error("device map module", base + ["--memory", 'device_map={"transformer.single_blocks.3" = "cpu"}'],
                 "memory.device_map.\"transformer.single_blocks.3\": transformer has no module single_blocks.3", np_=1)
    expect_error("device map component", base + ["--memory", 'device_map={"unet" = "cpu"}'],
                 "memory.device_map.\"unet\": unet is not a component", np_=1)
    expect_error("device map device", base + ["--memory", 'device_map={"vae" = "gpu"}'],
                 "--memory device_map.vae: 'gpu' is not a device")
    expect_error("device map with tp 2", base + ["--memory", 'device_map={"vae" = "cpu"}'],
                 "memory.device_map cannot be combined with tensor parallelism (tp = 2")
    expect_error("max_memory alone", base + ["--memory", 'max_memory={cpu="1GB"}'],
                 "memory.max_memory: budgets apply to memory.device_map = \"balanced\"", np_=1)
    expect_error("max_memory size", base + ["--memory", 'device_map="balanced"', "--memory", 'max_memory={cpu="lots"}'],
                 "--memory max_memory.cpu", np_=1)
    fw = ["forward", "--model", folder, "--component", "transformer", "--inputs", os.path.join(work, "none.safetensors"),
          "--out", os.path.join(work, "never.safetensors")]
    save_file(transformer_inputs(folder, "flux"), os.path.join(work, "none.safetensors"))
    expect_error("balanced for one component", fw + ["--memory", 'device_map="balanced"'],
                 "memory.device_map = \"balanced\" places the components of a pipeline", np_=1)
    expect_error("forward map module", fw + ["--memory", 'device_map={"blocks.1" = "disk"}',
                                            "--memory", f'offload_folder="{work}/x"'],
                 "memory.device_map.\"blocks.1\": names no module", np_=1)
    H.check(not os.path.exists(out) and not os.path.exists(os.path.join(work, "never.safetensors")),
            "no output written by any refused run")
    # The manifest's [memory] table: file:line and key.
    with open(os.path.join(work, "prompts.jsonl"), "w") as f:
        f.write('{"id": "a", "prompt": "x"}\n')
    manifest = os.path.join(work, "job.toml")
    with open(manifest, "w") as f:
        f.write(f'model = "{folder}"\nrequests = "prompts.jsonl"\n[memory]\n'
                'offload = { type = "block_level", to = "tape" }\n[output]\ndir = "out"\n')
    expect_error("manifest offload.to", ["run", manifest], "job.toml:4: memory.offload.to: 'tape' is not")


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {"offload": case_offload, "disk_reuse": case_disk_reuse, "device_map": case_device_map,
                            "errors": case_errors}, "tprun-offload")


if __name__ == "__main__":
    sys.exit(main())
