"""tools/bench_step's measurement: one transformer forward, tprun at tp 1 (2 threads) and tp 2
(1 thread per rank) against diffusers' class in the same venv, fp32 and bf16; prints two markdown
tables (times and FLOPs; max abs difference from diffusers' output) and writes WORKDIR/results.json.

  python tools/py/bench_step.py WORKDIR      (the venv's python; tools/bench_step runs it)

The configurations, the environment variables that shape the run (BENCH_STEP_*, BENCH_WAIT_IDLE)
and the binary (TPRUN_BIN / TPRUN_BUILD_DIR, tools/py/tprun_tools.py) are described in
tools/bench_step's header (`tools/bench_step --help`).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tprun_tools  # noqa: E402

torch = None  # imported by main(), so that --help needs nothing but python3

DTYPE_NAMES = ("fp32", "bf16")


def settings():
    """The run's settings from BENCH_STEP_* (see tools/bench_step --help)."""
    dtypes = [d for d in os.environ.get("BENCH_STEP_DTYPES", "fp32,bf16").split(",") if d]
    if not dtypes or any(d not in DTYPE_NAMES for d in dtypes):
        sys.exit(f"BENCH_STEP_DTYPES: a comma-separated list of {', '.join(DTYPE_NAMES)}")
    wh, ww = (int(x) for x in os.environ.get("BENCH_STEP_WIDE_GRID", "32x32").split("x"))
    return dict(iters=int(os.environ.get("BENCH_STEP_ITERS", "5")),
                wide_iters=int(os.environ.get("BENCH_STEP_WIDE_ITERS", "5")), wide_grid=(wh, ww),
                flux2_iters=int(os.environ.get("BENCH_STEP_FLUX2_ITERS", "5")),
                qwen_iters=int(os.environ.get("BENCH_STEP_QWEN_ITERS", "5")),
                only=[c for c in os.environ.get("BENCH_STEP_CONFIGS", "").split(",") if c], dtypes=dtypes)


def configs(s):
    """The benchmark's models (diffusers classes and configs), each with its fixed seed, those
    BENCH_STEP_CONFIGS selects."""
    from diffusers import Flux2Transformer2DModel, FluxTransformer2DModel, QwenImageTransformer2DModel
    wh, ww = s["wide_grid"]
    CONFIGS = [
        dict(name="mid-size", cls=FluxTransformer2DModel, iters=s["iters"], grid=(32, 32), txt=64,
             cfg=dict(num_layers=2, num_single_layers=4, attention_head_dim=64, num_attention_heads=8, in_channels=64,
                      joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                      axes_dims_rope=(8, 28, 28))),
        dict(name="FLUX.1-width", cls=FluxTransformer2DModel, iters=s["wide_iters"], grid=(wh, ww), txt=64,
             cfg=dict(num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=24, in_channels=64,
                      joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                      axes_dims_rope=(16, 56, 56))),
        dict(name="FLUX.2-klein-4B-width", cls=Flux2Transformer2DModel, iters=s["flux2_iters"], grid=(32, 32), txt=512,
             cfg=dict(patch_size=1, in_channels=128, num_layers=1, num_single_layers=1, attention_head_dim=128,
                      num_attention_heads=24, joint_attention_dim=7680, timestep_guidance_channels=256, mlp_ratio=3.0,
                      axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False)),
        dict(name="qwen-image-width", cls=QwenImageTransformer2DModel, iters=s["qwen_iters"], grid=(32, 32), txt=256,
             cfg=dict(patch_size=2, in_channels=64, out_channels=16, num_layers=1, attention_head_dim=128,
                      num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False,
                      axes_dims_rope=(16, 56, 56))),
    ]
    for k, c in enumerate(CONFIGS):
        c["seed"] = k  # fixed per config, whichever are selected
    return [c for c in CONFIGS if not s["only"] or c["name"] in s["only"]]


def build_model(cls, cfg, seed):
    """diffusers' class, every parameter re-drawn from a seeded generator (no zero-init layers)."""
    with torch.device("meta"):
        model = cls(**cfg)
    model = model.to_empty(device="cpu").to(torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * min(max(1.0 / math.sqrt(p.shape[1]), 0.02), 0.2))
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def make_inputs(cls, cfg, grid, txt, seed):
    """As FluxPipeline builds them: packed latents, T5 embeddings, CLIP pooled, t / 1000, ids, guidance.
    FLUX.2 as Flux2Pipeline / Flux2KleinPipeline: packed latents [B, H*W, 128], the text encoder's stacked
    hidden states [B, L, joint], t / 1000, 4-axis ids (Flux2Pipeline._prepare_latent_ids: cartesian_prod of
    t=0, h, w, l=0; _prepare_text_ids: t=0, h=0, w=0, l=0..L-1; int64, [B, S, 4]), guidance only with the
    guidance embedder (FLUX.2-dev; klein passes None). Qwen-Image as QwenImagePipeline: packed latents
    [B, H*W, 64] (H, W in 2x2 patches), the text encoder's last hidden state [B, L, 3584], t / 1000 and
    img_shapes (frames, H, W) per sample, here an int64 [B, 3] (tprun's input; diffusers gets the list, see
    diffusers_args); no encoder_hidden_states_mask (the pipeline passes None when no token is padded)."""
    g = torch.Generator().manual_seed(seed + 1000)
    h, w = grid
    if cls.__name__ == "QwenImageTransformer2DModel":
        return {
            "hidden_states": torch.randn(1, h * w, cfg["in_channels"], generator=g),
            "encoder_hidden_states": torch.randn(1, txt, cfg["joint_attention_dim"], generator=g),
            "timestep": torch.tensor([0.7]),
            "img_shapes": torch.tensor([[1, h, w]], dtype=torch.int64),
        }
    if cls.__name__ == "Flux2Transformer2DModel":
        one = torch.arange(1)
        inputs = {
            "hidden_states": torch.randn(1, h * w, cfg["in_channels"], generator=g),
            "encoder_hidden_states": torch.randn(1, txt, cfg["joint_attention_dim"], generator=g),
            "timestep": torch.tensor([0.7]),
            "img_ids": torch.cartesian_prod(one, torch.arange(h), torch.arange(w), one).unsqueeze(0),
            "txt_ids": torch.cartesian_prod(one, one, one, torch.arange(txt)).unsqueeze(0),
        }
        if cfg.get("guidance_embeds", True):
            inputs["guidance"] = torch.tensor([4.0])
        return inputs
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    return {
        "hidden_states": torch.randn(1, h * w, cfg["in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(1, txt, cfg["joint_attention_dim"], generator=g),
        "pooled_projections": torch.randn(1, cfg["pooled_projection_dim"], generator=g),
        "timestep": torch.tensor([0.7]),
        "img_ids": img_ids.reshape(h * w, 3),
        "txt_ids": torch.zeros(txt, 3),
        "guidance": torch.tensor([3.5]),
    }


def run_tprun(np_, threads, model_dir, inputs_path, dtype, n, out, extra=()):
    """`tprun bench step` on np_ ranks (`extra`: more of its options): its JSON line (median_s, gflops, ...)."""
    tprun_tools.wait_idle()
    cmd = tprun_tools.mpirun(np_, [
        tprun_tools.tprun_binary(), "bench", "step", "--model", model_dir, "--inputs", inputs_path, "--dtype", dtype,
        "--iters", str(n), "--warmup", "1", "--threads", str(threads), "--log-dir", "", "--log-level", "warn",
        "--out", out, *extra])
    r = subprocess.run(cmd, capture_output=True, text=True, env=tprun_tools.mpi_env())
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}")
    line = [l for l in r.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


def diffusers_args(inputs, dtype):
    """The saved inputs as diffusers' forward takes them: float tensors in the compute dtype, position ids
    as they are, Qwen-Image's img_shapes as its list (per sample) of lists of (frames, height, width)."""
    args = {}
    for k, v in inputs.items():
        if k == "img_shapes":
            args[k] = [[tuple(int(x) for x in row)] for row in v.tolist()]
        else:
            args[k] = v if k.endswith("_ids") else v.to(dtype)
    return args


def run_diffusers(cls, model_dir, inputs, dtype, n):
    """diffusers' forward: median seconds of n after one warm-up, and its output in fp32."""
    tprun_tools.wait_idle()
    model = cls.from_pretrained(model_dir, torch_dtype=dtype).eval()
    result = time_diffusers_forward(model, diffusers_args(inputs, dtype), n)
    del model
    return result


def time_diffusers_forward(model, args, n):
    """A loaded diffusers model's forward on `args`: median seconds of n after one warm-up, and its
    output in fp32."""
    times = []
    with torch.no_grad():
        out = model(**args, return_dict=False)[0]  # warm-up
        for _ in range(n):
            t0 = time.perf_counter()
            out = model(**args, return_dict=False)[0]
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out.float()


def measure(work, s, cases):
    """Every selected configuration and dtype: tprun tp 1, tp 2 and diffusers; the rows of the tables."""
    from safetensors.torch import load_file, save_file
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    rows, results = [], []
    t_start = time.time()
    print(f"# start: load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    for case in cases:
        cdir = os.path.join(work, case["name"])
        grid = f"{case['grid'][0]}x{case['grid'][1]}"
        model_dir, inputs_path = os.path.join(cdir, "model"), os.path.join(cdir, f"inputs_{grid}.safetensors")
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            build_model(case["cls"], case["cfg"], seed=case["seed"]).save_pretrained(model_dir)
        inputs = make_inputs(case["cls"], case["cfg"], case["grid"], case["txt"], seed=case["seed"])
        save_file({k: v.contiguous() for k, v in inputs.items()}, inputs_path)
        for dtype_name, dtype in ((d, dtypes[d]) for d in s["dtypes"]):
            n = case["iters"]
            out1 = os.path.join(cdir, f"tp1_{dtype_name}.safetensors")
            out2 = os.path.join(cdir, f"tp2_{dtype_name}.safetensors")
            r1 = run_tprun(1, 2, model_dir, inputs_path, dtype_name, n, out1)
            r2 = run_tprun(2, 1, model_dir, inputs_path, dtype_name, n, out2)
            d_s, ref = run_diffusers(case["cls"], model_dir, inputs, dtype, n)
            diff1 = (load_file(out1)["sample"] - ref).abs().max().item()
            diff2 = (load_file(out2)["sample"] - ref).abs().max().item()
            tokens = f"{case['grid'][0] * case['grid'][1]}+{case['txt']}"
            rows.append((case["name"], tokens, dtype_name, r1, r2, d_s, diff1, diff2, ref.abs().max().item()))
            results.append(dict(config=case["name"], tokens=tokens, dtype=dtype_name, tp1=r1, tp2=r2, diffusers_s=d_s,
                                max_abs_diff_tp1=diff1, max_abs_diff_tp2=diff2, max_abs_ref=ref.abs().max().item(),
                                loadavg_after=os.getloadavg()))
            print(f"# {case['name']} {dtype_name}: tp1 {r1['median_s']:.3f} s, tp2 {r2['median_s']:.3f} s, "
                  f"diffusers {d_s:.3f} s ({time.time() - t_start:.0f} s elapsed, load {os.getloadavg()[0]:.2f})",
                  file=sys.stderr, flush=True)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return rows


def report(rows, s):
    print(f"median of {s['iters']} forwards (FLUX.1-width: {s['wide_iters']}, FLUX.2: {s['flux2_iters']}, "
          f"Qwen-Image: {s['qwen_iters']}) after 1 warm-up; tprun: slowest rank, barrier before "
          f"each; GFLOP/s and share in matmul at tp 1 / tp 2\n")
    tprun_tools.table(
        ["config", "tokens (img+txt)", "dtype", "tprun tp1 (s)", "tprun tp2 (s)", "diffusers (s)",
         "speed-up vs diffusers (tp1)", "tp2 / tp1", "matmul GFLOP", "GFLOP/s", "bare matmul GFLOP/s (per rank)",
         "share in matmul"],
        [(name, tokens, dt, f"{r1['median_s']:.3f}", f"{r2['median_s']:.3f}", f"{d_s:.3f}",
          f"{d_s / r1['median_s']:.2f}x", f"{r2['median_s'] / r1['median_s']:.2f}", f"{r1['matmul_gflop']:.1f}",
          f"{r1['gflops']:.0f} / {r2['gflops']:.0f}", f"{r1['bare_rank_gflops']:.0f} / {r2['bare_rank_gflops']:.0f}",
          f"{r1['share_in_matmul']:.2f} / {r2['share_in_matmul']:.2f}")
         for name, tokens, dt, r1, r2, d_s, *_ in rows])
    print("\nmax abs diff of tprun's sample from diffusers' (same dtype, same weights and inputs):\n")
    tprun_tools.table(
        ["config", "dtype", "tp1", "tp2", "max abs diffusers sample", "tp1 / max abs", "tp2 / max abs"],
        [(name, dt, f"{diff1:.3g}", f"{diff2:.3g}", f"{scale:.3g}", f"{diff1 / scale:.2g}", f"{diff2 / scale:.2g}")
         for name, tokens, dt, r1, r2, d_s, diff1, diff2, scale in rows])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", help="working folder: models, inputs, outputs, results.json")
    args = ap.parse_args()
    s = settings()
    global torch
    import torch
    torch.set_num_threads(2)
    t_start = time.time()
    rows = measure(args.work, s, configs(s))
    report(rows, s)
    print(f"\n({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
