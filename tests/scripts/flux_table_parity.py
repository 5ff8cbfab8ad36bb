#!/usr/bin/env python3
"""Parity of tprun's Flux model table with diffusers' own class, at test time.

Builds FluxTransformer2DModel configs with diffusers (including one block at
FLUX.1's real width: hidden 3072, 24 heads), saves them with save_pretrained,
and checks `tprun inspect --json --tp N` against them: the same tensor names
and shapes, and the TP plan of every planned tensor equal to diffusers'
`_tp_plan` (colwise / rowwise / packed rowwise for single-block proj_out).

usage: flux_table_parity.py TPRUN
"""
import fnmatch
import json
import subprocess
import sys
import tempfile

import torch
from diffusers import FluxTransformer2DModel

CONFIGS = [
    dict(num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4, in_channels=16,
         joint_attention_dim=32, pooled_projection_dim=24, guidance_embeds=True, axes_dims_rope=(4, 6, 6)),
    dict(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=6, in_channels=8,
         joint_attention_dim=16, pooled_projection_dim=12, guidance_embeds=False, axes_dims_rope=(2, 2, 4),
         patch_size=2, out_channels=4),
    # One block of each kind at FLUX.1's real width.
    dict(num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=24, in_channels=64,
         joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56)),
]
STYLE = {"colwise": "colwise", "rowwise": "rowwise"}


def diffusers_style(plan, module):
    for key, style in plan.items():
        if fnmatch.fnmatchcase(module, key.replace("*", "[0-9]*")):
            name = style if isinstance(style, str) else type(style).__name__
            return key, {"colwise": "colwise", "rowwise": "rowwise",
                         "PackedRowwiseParallel": "packed_rowwise"}.get(name, name)
    return None, None


def main():
    tprun = sys.argv[1]
    failures = 0
    for cfg in CONFIGS:
        torch.manual_seed(0)
        with torch.device("meta") if cfg["attention_head_dim"] >= 128 else torch.device("cpu"):
            model = FluxTransformer2DModel(**cfg)
        with tempfile.TemporaryDirectory() as d:
            if cfg["attention_head_dim"] >= 128:
                model = model.to_empty(device="cpu")
            model.save_pretrained(d)
            tp = 2
            out = subprocess.run([tprun, "inspect", d, "--json", "--tp", str(tp)], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"FAIL {cfg}: tprun inspect exited {out.returncode}: {out.stderr}")
                failures += 1
                continue
            comp = json.loads(out.stdout)["components"][0]
            ours = {t["name"]: t for t in comp["tensors"]}
            theirs = {k: list(v.shape) for k, v in model.state_dict().items()}
            if set(ours) != set(theirs):
                print(f"FAIL names differ: only tprun {sorted(set(ours) - set(theirs))[:5]}, "
                      f"only diffusers {sorted(set(theirs) - set(ours))[:5]}")
                failures += 1
                continue
            for name, shape in theirs.items():
                if ours[name]["shape"] != shape:
                    print(f"FAIL {name}: tprun shape {ours[name]['shape']} vs diffusers {shape}")
                    failures += 1
                module, leaf = name.rsplit(".", 1)
                key, style = diffusers_style(FluxTransformer2DModel._tp_plan, module)
                plan = ours[name]["plan"]
                if style is None:
                    expected = "replicated"
                elif leaf == "bias" and style in ("rowwise", "packed_rowwise"):
                    expected = "replicated"  # added once, after the reduce
                else:
                    expected = style
                if plan != expected:
                    print(f"FAIL {name}: tprun plan {plan}, diffusers {expected} ({key})")
                    failures += 1
                elif key is not None and ours[name].get("plan_key") != key:
                    print(f"FAIL {name}: plan key {ours[name].get('plan_key')} vs diffusers {key}")
                    failures += 1
            if not comp["tp"]["valid"]:
                print(f"FAIL tp {tp} reported invalid: {comp['tp']}")
                failures += 1
            print(f"checked {len(theirs)} tensors of {cfg['num_attention_heads']}x{cfg['attention_head_dim']} config")
    print(f"{'FAILED' if failures else 'OK'}: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
