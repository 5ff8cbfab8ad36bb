"""The diffusers side of `tools/bench_batch --flux2-klein`, `--qwen-image` and `--wan`, and the image check.

  python tools/py/bench_batch_diffusers.py run FOLDER REQUESTS.jsonl OUT --height H --width W --steps N
                                               [--pipeline flux2-klein|qwen-image|wan] [--guidance G]
                                               [--guidance-2 G2] [--true-cfg-scale S] [--frames F]
                                               --max-sequence-length L [--threads T] [--shard I/N]
      Flux2KleinPipeline (default; --guidance required: its CFG scale) or QwenImagePipeline
      (--true-cfg-scale, default 4.0 as diffusers': true CFG for the requests that carry a
      "negative_prompt", a plain conditional pass for the others, as the pipeline decides)
      or WanPipeline (--guidance: guidance_scale, CFG with the request's "negative_prompt" or the
      pipeline's empty one when > 1; --guidance-2: guidance_scale_2 of a two-expert folder; --frames:
      num_frames unless the request has "frames") .from_pretrained(FOLDER) (fp32, as `tprun run`'s
      default dtype), then a loop over the requests (every N-th from the I-th, in file order) with each request's own seed
      (torch.Generator("cpu").manual_seed(seed): the noise tprun draws for that seed), saving
      OUT/images/<id>.png as a PIL image (uint8, diffusers' own numpy_to_pil rounding; a video's
      frames as OUT/videos/<id>/frame_00000.png ..., the layout of tprun's "frames" output). Prints one
      JSON line: seconds for the imports, the load and the loop, and images made. The whole-process
      wall time (interpreter start to exit) is measured by the caller.
  python tools/py/bench_batch_diffusers.py compare DIR_A DIR_B [ID ...]
      Max abs difference of the uint8 RGB images DIR_A/<id>.png and DIR_B/<id>.png (every PNG of
      DIR_A, in its subfolders too, when no id is given: a video's frames are <id>/frame_NNNNN);
      prints one JSON line, exit 1 if an image is missing or its shape differs.
"""
import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()
# --pipeline: the diffusers class each family runs.
PIPELINES = {"flux2-klein": "Flux2KleinPipeline", "qwen-image": "QwenImagePipeline", "wan": "WanPipeline"}


def run(args):
    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import diffusers
    from diffusers.utils import logging as dlogging
    dlogging.disable_progress_bar()
    t_import = time.perf_counter()
    if args.pipeline == "wan":
        # WanTransformer3DModel keeps some modules in fp32 (_keep_in_fp32_modules), which diffusers 0.40
        # loads only with low_cpu_mem_usage, i.e. with accelerate, which the venv does not hold. In fp32
        # every module is fp32 already: loading without the list gives the same model.
        diffusers.WanTransformer3DModel._keep_in_fp32_modules = None
    pipe = getattr(diffusers, PIPELINES[args.pipeline]).from_pretrained(args.folder, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    t_load = time.perf_counter()
    index, count = (int(x) for x in args.shard.split("/"))
    requests = [json.loads(l) for l in open(args.requests) if l.strip() and not l.lstrip().startswith("#")]
    mine = requests[index::count]
    images = os.path.join(args.out, "images")
    if args.pipeline != "wan":  # (a video's frames go to OUT/videos/<id>/)
        os.makedirs(images, exist_ok=True)
    with torch.inference_mode():
        for r in mine:
            if args.pipeline == "wan":
                run_wan(pipe, r, args)
                continue
            if args.pipeline == "qwen-image":
                guide = dict(negative_prompt=r.get("negative_prompt"),
                             true_cfg_scale=r.get("true_cfg_scale", args.true_cfg_scale))
            else:
                guide = dict(guidance_scale=r.get("guidance", args.guidance))
            image = pipe(prompt=r["prompt"], height=r.get("height", args.height), width=r.get("width", args.width),
                         num_inference_steps=r.get("steps", args.steps), **guide,
                         max_sequence_length=r.get("max_sequence_length", args.max_sequence_length),
                         generator=torch.Generator("cpu").manual_seed(r["seed"]), output_type="pil").images[0]
            image.save(os.path.join(images, f"{r['id']}.png"))
    t_loop = time.perf_counter()
    print(json.dumps({"shard": args.shard, "threads": args.threads, "images": len(mine),
                      "import_s": round(t_import - T0, 3), "load_s": round(t_load - t_import, 3),
                      "loop_s": round(t_loop - t_load, 3)}), flush=True)


def run_wan(pipe, r, args):
    """One WanPipeline request: its frames as OUT/videos/<id>/frame_NNNNN.png (PIL's uint8 rounding)."""
    import torch
    guide = dict(guidance_scale=r.get("guidance", args.guidance))
    if args.guidance_2 is not None or "guidance_2" in r:
        guide["guidance_scale_2"] = r.get("guidance_2", args.guidance_2)
    frames = pipe(prompt=r["prompt"], negative_prompt=r.get("negative_prompt"), height=r.get("height", args.height),
                  width=r.get("width", args.width), num_frames=r.get("frames", args.frames),
                  num_inference_steps=r.get("steps", args.steps), **guide,
                  max_sequence_length=r.get("max_sequence_length", args.max_sequence_length),
                  generator=torch.Generator("cpu").manual_seed(r["seed"]), output_type="pil").frames[0]
    folder = os.path.join(args.out, "videos", r["id"])
    os.makedirs(folder, exist_ok=True)
    for i, frame in enumerate(frames):
        frame.save(os.path.join(folder, f"frame_{i:05d}.png"))


def png_ids(folder):
    """Every PNG under folder as its path relative to it without ".png" (a video's frames: <id>/frame_NNNNN)."""
    ids = []
    for where, _, files in os.walk(folder):
        rel = os.path.relpath(where, folder)
        ids += [os.path.normpath(os.path.join(rel, f[:-4])) for f in files if f.endswith(".png")]
    return sorted(ids)


def compare(args):
    import numpy as np
    from PIL import Image
    ids = args.ids or png_ids(args.a)
    worst, per, bad = 0, {}, []
    for i in ids:
        pa, pb = os.path.join(args.a, f"{i}.png"), os.path.join(args.b, f"{i}.png")
        if not (os.path.exists(pa) and os.path.exists(pb)):
            bad.append(f"{i}: missing")
            continue
        a = np.asarray(Image.open(pa).convert("RGB"), dtype=np.int16)
        b = np.asarray(Image.open(pb).convert("RGB"), dtype=np.int16)
        if a.shape != b.shape:
            bad.append(f"{i}: shapes {a.shape} vs {b.shape}")
            continue
        d = int(np.abs(a - b).max())
        per[i] = d
        worst = max(worst, d)
    identical = sum(1 for d in per.values() if d == 0)
    print(json.dumps({"images": len(per), "max_abs_diff_uint8": worst, "identical": identical, "problems": bad}))
    return 1 if bad or not per else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("folder")
    r.add_argument("requests")
    r.add_argument("out")
    r.add_argument("--height", type=int, required=True)
    r.add_argument("--width", type=int, required=True)
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--pipeline", choices=sorted(PIPELINES), default="flux2-klein")
    r.add_argument("--guidance", type=float,
                   help="Flux2KleinPipeline's and WanPipeline's guidance_scale (required there)")
    r.add_argument("--guidance-2", type=float, help="WanPipeline's guidance_scale_2 (two-expert folders)")
    r.add_argument("--frames", type=int, default=9, help="WanPipeline's num_frames (4k + 1; default 9)")
    r.add_argument("--true-cfg-scale", type=float, default=4.0, help="QwenImagePipeline's true_cfg_scale")
    r.add_argument("--max-sequence-length", type=int, required=True)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--shard", default="0/1", help="I/N: every N-th request from the I-th")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("ids", nargs="*")
    args = ap.parse_args()
    if args.cmd == "run" and args.pipeline in ("flux2-klein", "wan") and args.guidance is None:
        ap.error(f"run --pipeline {args.pipeline} needs --guidance")
    if args.cmd == "run":
        run(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
