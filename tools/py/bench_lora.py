"""tools/bench_lora's measurement: one FLUX.1-width transformer forward with a rank-64 LoRA adapter,
tprun at tp 1 / 2 / 4 with the adapter fused into the weights and applied at run time, against the same
forward without an adapter, and diffusers + peft on the same transformer (adapter loaded unfused, then
fused) as the reference; prints a markdown table and writes WORKDIR/results.json.

  python tools/py/bench_lora.py WORKDIR      (the venv's python; tools/bench_lora runs it)

The model is tools/bench_step's "FLUX.1-width" configuration (same class, config, seed and inputs,
tools/py/bench_step.py); the adapter and the environment variables that shape the run
(BENCH_LORA_*, BENCH_WAIT_IDLE) are described in tools/bench_lora's header (`tools/bench_lora --help`).
"""
import argparse
import json
import os
import sys
import time

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_step  # noqa: E402
import tprun_tools  # noqa: E402

torch = None  # imported by main(), so that --help needs nothing but python3

CONFIG = "FLUX.1-width"
DTYPE_NAMES = ("fp32", "bf16")
# The Linear modules of each block the adapter adapts (FluxTransformer2DModel's names): every projection
# of attention and the feed-forwards; the adaLN modulation linears (norm1.linear, norm1_context.linear,
# norm.linear) and the embedders outside the blocks are left as they are.
DOUBLE_BLOCK_MODULES = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                        "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                        "ff_context.net.2")
SINGLE_BLOCK_MODULES = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out")
MODES = ("none", "runtime", "fused")


def settings():
    """The run's settings from BENCH_LORA_* (see tools/bench_lora --help)."""
    env = os.environ.get
    dtype = env("BENCH_LORA_DTYPE", "fp32")
    if dtype not in DTYPE_NAMES:
        sys.exit(f"BENCH_LORA_DTYPE: one of {', '.join(DTYPE_NAMES)}")
    try:
        gh, gw = (int(x) for x in env("BENCH_LORA_GRID", "32x32").split("x"))
        tps = [int(t) for t in env("BENCH_LORA_TPS", "1,2,4").split(",") if t]
        iters, rank = int(env("BENCH_LORA_ITERS", "3")), int(env("BENCH_LORA_RANK", "64"))
    except ValueError:
        sys.exit("BENCH_LORA_GRID is HxW, BENCH_LORA_TPS a comma-separated list of rank counts, "
                 "BENCH_LORA_ITERS and BENCH_LORA_RANK integers")
    if not tps or any(t < 1 or t > 8 for t in tps) or iters < 1 or rank < 1 or min(gh, gw) < 1:
        sys.exit("BENCH_LORA_TPS: 1..8 each; BENCH_LORA_ITERS, BENCH_LORA_RANK and the grid at least 1")
    return dict(grid=(gh, gw), tps=tps, iters=iters, rank=rank, dtype=dtype,
                diffusers=env("BENCH_LORA_DIFFUSERS", "1") != "0")


def flux_width_case(s):
    """bench_step's FLUX.1-width configuration (class, config, seed, 64 text tokens) at this run's grid."""
    step_settings = dict(iters=s["iters"], wide_iters=s["iters"], wide_grid=s["grid"], flux2_iters=s["iters"],
                         qwen_iters=s["iters"], only=[CONFIG])
    (case,) = bench_step.configs(step_settings)
    return case


def adapted_modules(model):
    """The modules the adapter reaches, in the model's order, with their (in, out) features."""
    wanted = set()
    for i in range(len(model.transformer_blocks)):
        wanted.update(f"transformer_blocks.{i}.{m}" for m in DOUBLE_BLOCK_MODULES)
    for i in range(len(model.single_transformer_blocks)):
        wanted.update(f"single_transformer_blocks.{i}.{m}" for m in SINGLE_BLOCK_MODULES)
    out = [(name, m.in_features, m.out_features) for name, m in model.named_modules()
           if name in wanted and isinstance(m, torch.nn.Linear)]
    missing = wanted - {name for name, _, _ in out}
    if missing:
        sys.exit(f"bench_lora: the model has no Linear {sorted(missing)[0]!r}")
    return out


def make_adapter(modules, rank, seed):
    """A PEFT-format adapter (transformer.<module>.lora_A.weight [r, in], lora_B.weight [out, r], bf16 as
    adapters are usually shipped, no alpha: scale 1), random, B non-zero. Sized so the adapter moves
    each layer's output by a few per cent of the base term (A ~ N(0, 1/in), B ~ N(0, 0.1^2 / r))."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, fin, fout in modules:
        tensors[f"transformer.{name}.lora_A.weight"] = (torch.randn(rank, fin, generator=g) / fin ** 0.5).bfloat16()
        tensors[f"transformer.{name}.lora_B.weight"] = (torch.randn(fout, rank, generator=g) * 0.1 / rank ** 0.5).bfloat16()
    return tensors


def prepare_files(work, s, case):
    """The model (kept between runs, as bench_step keeps it), the inputs and the adapter in WORKDIR."""
    from safetensors.torch import save_file
    model_dir = os.path.join(work, "model")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        bench_step.build_model(case["cls"], case["cfg"], seed=case["seed"]).save_pretrained(model_dir)
    grid = f"{s['grid'][0]}x{s['grid'][1]}"
    inputs = bench_step.make_inputs(case["cls"], case["cfg"], case["grid"], case["txt"], seed=case["seed"])
    inputs_path = os.path.join(work, f"inputs_{grid}.safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, inputs_path)
    with torch.device("meta"):
        modules = adapted_modules(case["cls"](**case["cfg"]))
    adapter = make_adapter(modules, s["rank"], seed=case["seed"] + 2000)
    adapter_path = os.path.join(work, f"adapter_r{s['rank']}.safetensors")
    save_file(adapter, adapter_path)
    return model_dir, inputs, inputs_path, adapter, adapter_path, modules


def run_tprun(s, tp, mode, model_dir, inputs_path, adapter_path, out):
    """`tprun bench step` at tp ranks (2 threads at tp 1, 1 thread per rank beyond), the adapter applied
    as `mode` says (none: no --lora); its JSON line."""
    extra = ["--no-bare"]
    if mode != "none":
        extra += ["--lora", adapter_path, "--lora-apply", mode]
    r = bench_step.run_tprun(tp, max(1, 2 // tp), model_dir, inputs_path, s["dtype"], s["iters"], out, extra)
    if mode != "none" and r.get("lora", {}).get("apply") != mode:
        sys.exit(f"tprun bench step --lora-apply {mode} at tp {tp} reported {r.get('lora')}")
    return r


def run_diffusers(case, model_dir, inputs, adapter, dtype, n):
    """diffusers' forward without the adapter, with it loaded by peft (load_lora_adapter + set_adapters,
    unfused), and after fuse_lora: each {median_s, out}, with the load and fuse seconds."""
    tprun_tools.wait_idle()
    model = case["cls"].from_pretrained(model_dir, torch_dtype=dtype).eval()
    args = bench_step.diffusers_args(inputs, dtype)
    res = {"none": bench_step.time_diffusers_forward(model, args, n)}
    t0 = time.perf_counter()
    model.load_lora_adapter(dict(adapter), prefix="transformer", adapter_name="bench")
    model.set_adapters(["bench"], [1.0])
    load_s = time.perf_counter() - t0
    res["runtime"] = bench_step.time_diffusers_forward(model, args, n)
    t0 = time.perf_counter()
    model.fuse_lora(lora_scale=1.0, adapter_names=["bench"])
    fuse_s = time.perf_counter() - t0
    res["fused"] = bench_step.time_diffusers_forward(model, args, n)
    del model
    return res, load_s, fuse_s


def measure(work, s):
    """Every tp and mode, then diffusers; the rows of the table and results.json."""
    from safetensors.torch import load_file
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    case = flux_width_case(s)
    os.makedirs(work, exist_ok=True)
    t_start = time.time()
    model_dir, inputs, inputs_path, adapter, adapter_path, modules = prepare_files(work, s, case)
    adapter_bytes = os.path.getsize(adapter_path)
    loadavg_start = os.getloadavg()
    print(f"# files ready ({time.time() - t_start:.0f} s); start: load average "
          f"{' '.join(f'{x:.2f}' for x in loadavg_start)}", file=sys.stderr, flush=True)
    runs = {}
    for tp in s["tps"]:
        for mode in MODES:
            out = os.path.join(work, f"tp{tp}_{mode}.safetensors")
            runs[(tp, mode)] = r = run_tprun(s, tp, mode, model_dir, inputs_path, adapter_path, out)
            r["sample_path"] = out
            r["loadavg_after"] = os.getloadavg()
            print(f"# tp {tp} {mode}: {r['median_s']:.3f} s ({time.time() - t_start:.0f} s elapsed, load "
                  f"{os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    ref = None
    if s["diffusers"]:
        ref, load_s, fuse_s = run_diffusers(case, model_dir, inputs, adapter, dtypes[s["dtype"]], s["iters"])
        print(f"# diffusers: {ref['none'][0]:.3f} / {ref['runtime'][0]:.3f} / {ref['fused'][0]:.3f} s "
              f"({time.time() - t_start:.0f} s elapsed, load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    results = dict(config=CONFIG, grid=list(s["grid"]), text_tokens=case["txt"], dtype=s["dtype"],
                   iters=s["iters"], rank=s["rank"], adapted_modules=[m for m, _, _ in modules],
                   adapter_file_bytes=adapter_bytes, tprun=[], loadavg_start=loadavg_start, loadavg_end=os.getloadavg(),
                   seconds=time.time() - t_start)
    for (tp, mode), r in runs.items():
        row = dict(tp=tp, mode=mode, median_s=r["median_s"], times_s=r["times_s"],
                   ratio=r["median_s"] / runs[(tp, "none")]["median_s"], peak_rss_bytes=r["peak_rss_bytes"],
                   threads=r["threads"], lora=r.get("lora"), loadavg_after=r["loadavg_after"])
        if ref is not None:
            row["max_abs_diff_vs_diffusers"] = (load_file(r["sample_path"])["sample"] - ref[mode][1]).abs().max().item()
        results["tprun"].append(row)
    if ref is not None:
        results["diffusers"] = dict(
            none_s=ref["none"][0], unfused_s=ref["runtime"][0], fused_s=ref["fused"][0], load_adapter_s=load_s,
            fuse_s=fuse_s, max_abs_sample=ref["none"][1].abs().max().item(),
            max_abs_adapter_effect=(ref["runtime"][1] - ref["none"][1]).abs().max().item(),
            max_abs_unfused_vs_fused=(ref["runtime"][1] - ref["fused"][1]).abs().max().item())
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results


def mib(b):
    return f"{b / 2**20:.1f}"


def report(res):
    print(f"{CONFIG} (1 double + 1 single block, 24 heads x 128), {res['grid'][0]}x{res['grid'][1]} latent grid = "
          f"{res['grid'][0] * res['grid'][1]} image + {res['text_tokens']} text tokens, {res['dtype']}; adapter rank "
          f"{res['rank']} on {len(res['adapted_modules'])} Linears, {mib(res['adapter_file_bytes'])} MiB on disk "
          f"(bf16); median of {res['iters']} forwards after 1 warm-up; tprun: slowest rank, 2 threads at tp 1, "
          f"1 thread per rank beyond; bytes and peak RSS are rank 0's\n")
    cols = ["runner", "tp", "adapter", "step (s)", "vs no adapter", "prepare (s)", "adapter MiB read / rank",
            "adapter MiB kept / rank", "peak RSS rank 0 (MiB)"]
    if "diffusers" in res:
        cols.append("max abs diff vs diffusers")
    rows = []
    for r in res["tprun"]:
        lo = r["lora"] or {}
        row = ["tprun", r["tp"], r["mode"], f"{r['median_s']:.3f}", f"{r['ratio']:.3f}",
               f"{lo['prepare_s']:.2f}" if lo else "-", mib(lo["bytes_read"]) if lo else "-",
               mib(lo["bytes_resident"]) if lo else "-", mib(r["peak_rss_bytes"])]
        if "diffusers" in res:
            row.append(f"{r['max_abs_diff_vs_diffusers']:.2g}")
        rows.append(row)
    d = res.get("diffusers")
    if d:
        for mode, key, prep in (("none", "none_s", "-"), ("peft, unfused", "unfused_s", f"{d['load_adapter_s']:.2f}"),
                                ("peft, fused", "fused_s", f"{d['load_adapter_s'] + d['fuse_s']:.2f}")):
            rows.append(["diffusers", 1, mode, f"{d[key]:.3f}", f"{d[key] / d['none_s']:.3f}", prep, "-", "-", "-", "-"])
    tprun_tools.table(cols, rows)
    if d:
        print(f"\ndiffusers: load_lora_adapter + set_adapters {d['load_adapter_s']:.2f} s, fuse_lora "
              f"{d['fuse_s']:.2f} s; the adapter moves the sample by up to {d['max_abs_adapter_effect']:.3g} "
              f"(max |sample| {d['max_abs_sample']:.3g}); diffusers unfused vs fused {d['max_abs_unfused_vs_fused']:.2g}")
    print(f"load average (1, 5, 15 min) at the start: {' '.join(f'{x:.2f}' for x in res['loadavg_start'])}; at the "
          f"end: {' '.join(f'{x:.2f}' for x in res['loadavg_end'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", help="working folder: model, inputs, adapter, outputs, results.json")
    args = ap.parse_args()
    s = settings()
    global torch
    import torch
    bench_step.torch = torch  # bench_step imports torch in its own main(); its helpers read that global
    torch.set_num_threads(2)
    res = measure(args.work, s)
    report(res)
    print(f"\n({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
