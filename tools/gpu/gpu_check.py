"""Python side of the GPU check (tools/gpu/run.sh): runs under the GPU host's own python3 (torch 2.11,
safetensors; diffusers from the bundle's wheels), or the venv's python for the CPU rehearsal.

  make-flux DIR --double N --single M [--device D]   a FluxTransformer2DModel folder at FLUX.1-dev's
        width (24 heads x 128, joint 4096, pooled 768, in_channels 64), random bf16 weights, written by
        diffusers' save_pretrained (so tprun reads the layout diffusers writes)
  inputs OUT --img N --txt M                         the transformer's inputs as FluxPipeline builds
        them for an image of N packed tokens (a square grid) and M text tokens
  diffusers-step DIR INPUTS --device D --iters K --json OUT [--out SAMPLE]
        diffusers' eager forward on the same weights and inputs: median seconds of K timed forwards
  compare A B [--key sample] [--tol X]               max abs diff of two safetensors tensors; exit 1 above X
  load-row JSON                                      a markdown row of `tprun bench load`'s JSON line
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
from safetensors.torch import load_file, save_file


def flux_config(double, single):
    return dict(num_layers=double, num_single_layers=single, attention_head_dim=128, num_attention_heads=24,
                in_channels=64, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=(16, 56, 56))


def make_flux(a):
    from diffusers import FluxTransformer2DModel
    with torch.device("meta"):
        model = FluxTransformer2DModel(**flux_config(a.double, a.single))
    model = model.to_empty(device=a.device).to(torch.bfloat16)
    g = torch.Generator(device=a.device).manual_seed(a.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Scaled so 15 blocks stay finite: weights ~ 1/sqrt(fan_in), norms near 1, small biases.
            r = torch.randn(p.shape, generator=g, device=a.device, dtype=torch.float32)
            if name.endswith(".bias"):
                p.copy_(r * 0.02)
            elif p.ndim >= 2:
                p.copy_(r / math.sqrt(p.shape[1]))
            else:
                p.copy_(1.0 + r * 0.05)
    t0 = time.perf_counter()
    model.save_pretrained(a.dir, max_shard_size="5GB")
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"dir": a.dir, "bytes": n, "double": a.double, "single": a.single,
                      "save_s": round(time.perf_counter() - t0, 2)}))


def make_inputs(a):
    side = int(math.isqrt(a.img))
    if side * side != a.img:
        sys.exit(f"--img {a.img}: a square number of tokens is needed")
    g = torch.Generator().manual_seed(7)
    img_ids = torch.zeros(side, side, 3)
    img_ids[..., 1] = torch.arange(side)[:, None]
    img_ids[..., 2] = torch.arange(side)[None, :]
    save_file({
        "hidden_states": torch.randn(1, a.img, 64, generator=g),
        "encoder_hidden_states": torch.randn(1, a.txt, 4096, generator=g),
        "pooled_projections": torch.randn(1, 768, generator=g),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids.reshape(a.img, 3),
        "txt_ids": torch.zeros(a.txt, 3),
        "guidance": torch.tensor([3.5]),
    }, a.out)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def diffusers_step(a):
    from diffusers import FluxTransformer2DModel
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    t0 = time.perf_counter()
    model = FluxTransformer2DModel.from_pretrained(a.dir, torch_dtype=dtype).to(a.device).eval()
    sync(a.device)
    load_s = time.perf_counter() - t0
    inputs = load_file(a.inputs)
    args = {k: (v if k.endswith("_ids") else v.to(dtype)).to(a.device) for k, v in inputs.items()}
    times = []
    with torch.no_grad():
        out = model(**args, return_dict=False)[0]  # warm-up
        sync(a.device)
        for _ in range(a.iters):
            t0 = time.perf_counter()
            out = model(**args, return_dict=False)[0]
            sync(a.device)
            times.append(time.perf_counter() - t0)
    if a.out:
        save_file({"sample": out.float().cpu().contiguous()}, a.out)
    res = {"median_s": statistics.median(times), "min_s": min(times), "iters": a.iters, "load_s": load_s,
           "device": a.device, "dtype": a.dtype,
           "peak_gpu_bytes": torch.cuda.max_memory_allocated() if a.device.startswith("cuda") else 0}
    with open(a.json, "w") as f:
        json.dump(res, f)
    print(json.dumps(res))


def load_row(a):
    """One table row of `tprun bench load`'s JSON line."""
    lines = [l for l in open(a.json).read().splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"{a.json}: no JSON line")
    r = json.loads(lines[-1])
    gib = 2.0 ** 30
    secs = max(r.get("seconds", 0.0), 1e-9)
    kept = r.get("slice_bytes", 0) + r.get("replicated_bytes", 0)
    dev = r.get("device_bytes_after_load")
    dev_text = "-" if dev is None else f"{dev / gib:.2f} GiB (slices {kept / gib:.2f} GiB)"
    tp = f"{r.get('tp')} (rank {r.get('rank')})"
    print(f"| {r.get('mode')} | {tp} | {secs:.2f} | {r.get('read_bytes', 0) / secs / 1e9:.2f} | "
          f"{r.get('peak_rss', 0) / gib:.2f} GiB | {dev_text} |")


def compare(a):
    x, y = load_file(a.a)[a.key].float(), load_file(a.b)[a.key].float()
    if x.shape != y.shape:
        print(f"{a.a} vs {a.b}: shapes differ {tuple(x.shape)} vs {tuple(y.shape)}")
        sys.exit(1)
    d = (x - y).abs().max().item()
    finite = bool(torch.isfinite(x).all())
    print(f"max abs diff {d:.3g} (max |ref| {y.abs().max().item():.3g}, finite {finite})")
    sys.exit(0 if finite and (a.tol is None or d <= a.tol) else 1)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-flux")
    m.add_argument("dir")
    m.add_argument("--double", type=int, default=5)
    m.add_argument("--single", type=int, default=10)
    m.add_argument("--device", default="cpu")
    m.add_argument("--seed", type=int, default=0)
    i = sub.add_parser("inputs")
    i.add_argument("out")
    i.add_argument("--img", type=int, default=4096)
    i.add_argument("--txt", type=int, default=512)
    d = sub.add_parser("diffusers-step")
    d.add_argument("dir")
    d.add_argument("inputs")
    d.add_argument("--device", default="cpu")
    d.add_argument("--dtype", default="bf16")
    d.add_argument("--iters", type=int, default=5)
    d.add_argument("--json", required=True)
    d.add_argument("--out")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--key", default="sample")
    c.add_argument("--tol", type=float)
    lr = sub.add_parser("load-row")
    lr.add_argument("json")
    a = p.parse_args()
    {"make-flux": make_flux, "inputs": make_inputs, "diffusers-step": diffusers_step, "compare": compare, "load-row": load_row}[a.cmd](a)


if __name__ == "__main__":
    main()
