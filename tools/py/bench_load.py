"""tools/bench_load's Python: small readers of `tprun inspect` / `tprun bench load --plan-only`
JSON for the bash driver, and the reports.

  ... | python tools/py/bench_load.py rank-bytes       inspect's JSON (stdin): bytes rank 1 keeps
  ... | python tools/py/bench_load.py keep-bytes       a plan's JSON (stdin): slice + replicated bytes
  ... | python tools/py/bench_load.py inspect-line TP [--model NAME]
                                                       inspect's JSON (stdin) as one line: model,
                                                       tp, total_bytes, tp_info
  python tools/py/bench_load.py report RESULTS SET [INSPECT] [BYTES]
      the runs table of any set (median run per configuration, with the spread), the
      load-then-shard / shard-on-load ratios, and (--flux2) inspect's bytes per rank against
      `bench load`'s plan and reads
  python tools/py/bench_load.py report-mistral RESULTS PLANS INSPECT FOLDER
      the Mistral text encoder: the checkpoint by part from its shard headers, bytes per rank
      (inspect, the plan with and without the layer cut, a count from the headers) and the runs
  python tools/py/bench_load.py report-qwen-image RESULTS PLANS INSPECT
      Qwen-Image: bytes per rank (inspect, plan, read) per component and tp
  python tools/py/bench_load.py report-wan RESULTS PLANS INSPECT
      Wan (the 14B transformer, UMT5-XXL): the same table

tools/bench_load runs these (`tools/bench_load --help` describes the benchmark).
"""
import argparse
import glob
import json
import os
import struct
import sys

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tprun_tools  # noqa: E402

NAMES = {"flux-dev": "FLUX.1-dev", "flux-short": "shortened", "flux2-dev": "FLUX.2-dev",
         "flux2-short": "FLUX.2-dev shortened (2+8)", "flux2-klein-4b": "FLUX.2-klein-4B",
         "flux2-klein-9b": "FLUX.2-klein-9B", "qwen-image": "Qwen-Image transformer",
         "qwen-image-short": "Qwen-Image shortened (6 blocks)", "qwen2.5-vl-7b": "Qwen2.5-VL-7B text encoder",
         "wan2.1-14b": "Wan2.1-T2V-14B transformer", "wan-short": "Wan 14B shortened (4 blocks)",
         "umt5-xxl": "UMT5-XXL text encoder"}


def gb(b):
    return f"{b / 1e9:.2f}"


def read_lines(path):
    """The non-empty lines of a .jsonl file, parsed."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def secs(r):
    """A median run's seconds, with the spread when the configuration ran more than once."""
    a = r["all_seconds"]
    return f"{r['seconds']:.2f}" if len(a) == 1 else f"{r['seconds']:.2f} ({a[0]:.1f}–{a[-1]:.1f}, n={len(a)})"


def exact_count(rows):
    exact = [r for r in rows if r["mode"] != "load-then-shard"]
    return sum(r["read_bytes"] == r["slice_bytes"] + r["replicated_bytes"] for r in exact), len(exact)


# ---- readers for the bash driver -------------------------------------------------------------

def rank_bytes(_):
    print(json.load(sys.stdin)["components"][0]["tp"]["bytes_per_rank"][1])


def keep_bytes(_):
    j = json.load(sys.stdin)
    print(j["slice_bytes"] + j["replicated_bytes"])


def inspect_line(args):
    c = json.load(sys.stdin)["components"][0]
    line = {"model": args.model} if args.model else {}
    line.update({"tp": args.tp, "total_bytes": c.get("total_bytes"), "tp_info": c["tp"]})
    print(json.dumps(line))


# ---- the Mistral set -------------------------------------------------------------------------

LM, RUN = "language_model.model.", 30  # Flux2Pipeline stacks hidden states 10, 20, 30: layers 0..29 run
SPLIT = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight",
         "down_proj.weight")  # transformers' TP plan for Mistral slices these; everything else is whole


def header_tensors(folder):
    """name -> bytes of every tensor in the folder's safetensors shards, from the headers alone."""
    tensors = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                tensors[k] = v["data_offsets"][1] - v["data_offsets"][0]
    return tensors


def mistral_group(name):
    if name.startswith(LM + "layers."):
        return "layers 0-29" if int(name[len(LM) + 7:].split(".")[0]) < RUN else "layers 30-39"
    if name.startswith(LM + "embed_tokens"):
        return "embeddings"
    if name == LM + "norm.weight":
        return "final norm"
    if name.startswith("language_model.lm_head"):
        return "lm_head"
    if name.startswith("vision_tower."):
        return "vision tower"
    if name.startswith("multi_modal_projector."):
        return "projector"
    return "other"


def report_mistral(args):
    rows = tprun_tools.read_json_lines(args.results)  # a log line a model load prints is not a result
    plans = tprun_tools.read_json_lines(args.plans)
    inspect = {j["tp"]: j for j in read_lines(args.inspect)}
    tensors = header_tensors(args.folder)

    def counted(tp):  # an independent count from the shard headers alone
        return sum(b // tp if n.endswith(SPLIT) else b for n, b in tensors.items()
                   if mistral_group(n) in ("layers 0-29", "embeddings"))

    groups = {}
    for n, b in tensors.items():
        groups.setdefault(mistral_group(n), [0, 0])
        groups[mistral_group(n)][0] += 1
        groups[mistral_group(n)][1] += b
    total = sum(tensors.values())
    print(f"Checkpoint: {len(tensors)} tensors, {gb(total)} GB (bf16), by part (tensors, GB):",
          ", ".join(f"{g} {c} / {gb(b)}" for g, (c, b) in sorted(groups.items(), key=lambda kv: -kv[1][1])))
    skipped = {g: groups[g][1] for g in ("layers 30-39", "lm_head", "vision tower", "projector", "final norm")
               if g in groups}
    print(f"Never read with the cut: {gb(sum(skipped.values()))} GB of the checkpoint ("
          + ", ".join(f"{g} {gb(b)}" for g, b in skipped.items()) + ")\n")
    plan_cut = {p["tp"]: p for p in plans if p["hidden_layers"]}
    plan_all = {p["tp"]: p for p in plans if not p["hidden_layers"]}
    tprun_tools.table_header(["tp (rank)", "whole checkpoint: inspect, per rank (GB)", "bench load --plan table (GB)",
                              "with the cut: bench load plan (GB)", "header count (GB)", "saved by the cut (GB)",
                              "saved"])
    for tp in sorted(plan_cut):
        c, a = plan_cut[tp], plan_all[tp]
        r = c["rank"]
        per = inspect[tp]["tp_info"].get("bytes_per_rank") or []
        whole = per[r] if per else None
        need, need_all = c["slice_bytes"] + c["replicated_bytes"], a["slice_bytes"] + a["replicated_bytes"]
        count = counted(tp)
        ok = "" if need == count and whole == need_all else " **mismatch**"
        tprun_tools.table_row([f"{tp} ({r})", gb(whole) if whole is not None else inspect[tp]["tp_info"].get("error"),
                               gb(need_all), f"{gb(need)} ({need} B)", f"{gb(count)}{ok}",
                               gb(whole - need) if whole is not None else "-", f"{100 * (whole - need) / whole:.0f} %"])
    print()
    measured = tprun_tools.median_runs(
        rows, lambda r: (r["tp"], r["mode"], r["plan"], tuple(r["hidden_layers"]), r.get("dropped", False)))
    tprun_tools.table_header(["tp (rank)", "layers read", "mode", "seconds", "read (GB)", "slices + replicated (GB)",
                              "read / needed", "peak RSS growth (GB)", "growth / needed", "time / sequential"])
    seq = {}
    for r in sorted(measured, key=lambda r: (r["tp"], not r["hidden_layers"], r.get("dropped", False),
                                             ["sequential", "shard-on-load", "model-load"].index(r["mode"]))):
        key = (r["tp"], tuple(r["hidden_layers"]), r.get("dropped", False))
        need = r["slice_bytes"] + r["replicated_bytes"]
        if r["mode"] == "sequential":
            seq[key] = r["seconds"]
        ratio = f"{r['seconds'] / seq[key]:.2f}" if key in seq and r["mode"] != "sequential" else "-"
        dropped = r.get("dropped", False)
        if dropped:
            growth = f"- (dropped; largest tensor {gb(r['largest_item_bytes'])})"
        else:
            growth = f"{r['peak_growth'] / need:.3f}" if r["mode"] != "sequential" else "-"
        layers = "0-29 (cut)" if r["hidden_layers"] else "all + vision + lm_head"
        mode = r["mode"] + (" --drop" if dropped else "")
        tprun_tools.table_row([f"{r['tp']} ({r['rank']})", layers, mode, secs(r), gb(r["read_bytes"]), gb(need),
                               f"{r['read_bytes'] / need:.3f}", gb(r["peak_growth"]), growth, ratio])
    same, n = exact_count(rows)
    print(f"\nruns with read == slice + replicated to the byte: {same} of {n}")


# ---- the Qwen-Image and Wan sets --------------------------------------------------------------

def report_qwen_image(args):
    report_components(args, {"qwen-image": "transformer", "qwen2.5-vl-7b": "text encoder"},
                      "the encoder's: the text model only")


def report_wan(args):
    report_components(args, {"wan2.1-14b": "transformer (14B; each A14B expert)", "umt5-xxl": "text encoder (UMT5-XXL)"},
                      "the encoder's: every layer and the shared embedding")


def report_components(args, names, plan_note):
    """Bytes per rank of a pipeline's components: inspect, the load's plan, what shard-on-load read."""
    rows = tprun_tools.read_json_lines(args.results)
    plans = tprun_tools.read_json_lines(args.plans)
    inspect = {(j["model"], j["tp"]): j for j in read_lines(args.inspect)}
    base = lambda path: path.rstrip("/").rsplit("/", 1)[-1]  # noqa: E731
    plan = {(base(p["model"]), p["tp"], p["shard_modulation"]): p for p in plans}
    read = {(base(r["model"]), r["tp"]): r for r in rows if r["mode"] == "shard-on-load"}
    print("Bytes per rank (rank 1; GB): `tprun inspect --tp N` (every tensor of the checkpoint), the load's plan "
          f"(slices + replicated; {plan_note}) and what shard-on-load read:\n")
    tprun_tools.table_header(["component", "checkpoint (GB)", "tp", "inspect", "plan", "read", "read == plan",
                              "inspect - read", "plan, AdaLN sharded"])
    for (m, tp), i in sorted(inspect.items()):
        per = i["tp_info"].get("bytes_per_rank") or []
        shown = gb(per[1]) if len(per) > 1 else i["tp_info"].get("error", "-")
        p, r, ps = plan.get((m, tp, False)), read.get((m, tp)), plan.get((m, tp, True))
        if p is None or r is None:
            tprun_tools.table_row([names[m], gb(i["total_bytes"] or 0), tp, shown, "-", "-", "-", "-", "-"])
            continue
        need = p["slice_bytes"] + p["replicated_bytes"]
        tprun_tools.table_row([names[m], gb(r["checkpoint_bytes"]), tp, shown,
                               f"{gb(need)} ({gb(p['slice_bytes'])} + {gb(p['replicated_bytes'])})", gb(r["read_bytes"]),
                               "yes" if r["read_bytes"] == need else "NO",
                               gb(per[1] - r["read_bytes"]) if len(per) > 1 else "-",
                               gb(ps["slice_bytes"] + ps["replicated_bytes"]) if ps else "-"])
    print()


# ---- every set -------------------------------------------------------------------------------

def label(r):
    """(folder name, the table's model label) of a run."""
    base = os.path.basename(r.get("model", "").rstrip("/"))
    if not base:  # results of an older tprun without the "model" field
        base = "flux-dev" if r["checkpoint_bytes"] > 2e10 else "flux-short"
    return base, f"{NAMES.get(base, base)} {r['checkpoint_bytes'] / 1e9:.1f} GB"


def report(args):
    rows = tprun_tools.read_json_lines(args.results)
    # Repeated runs of one configuration: one row, the median run (seconds and peak of that run).
    measured = tprun_tools.median_runs(rows, lambda r: (r.get("model"), r["checkpoint_bytes"], r["tp"],
                                                        r["shard_modulation"], r.get("dropped", False), r["mode"]))
    tprun_tools.table_header(["model", "tp", "AdaLN", "mode", "seconds", "read (GB)", "slice + replicated (GB)",
                              "read / needed", "peak RSS growth (GB)", "growth / needed", "time / sequential"])
    seq = {}
    for r in measured:
        key = (r.get("model"), r["checkpoint_bytes"], r["tp"], r["shard_modulation"], r.get("dropped", False))
        need = r["slice_bytes"] + r["replicated_bytes"]
        if r["mode"] == "sequential":
            seq[key] = r["seconds"]
        ratio = f"{r['seconds'] / seq[key]:.2f}" if key in seq and r["mode"] != "sequential" else "-"
        dropped = r.get("dropped", False)
        if dropped:
            growth = f"- (dropped; largest tensor {gb(r['largest_item_bytes'])})"
        else:
            growth = f"{r['peak_growth'] / need:.2f}" if r["mode"] != "sequential" else "-"
        mode = r["mode"] + (" --drop" if dropped else "")
        tprun_tools.table_row([label(r)[1], r["tp"], "sharded" if r["shard_modulation"] else "replicated", mode,
                               secs(r), gb(r["read_bytes"]), gb(need), f"{r['read_bytes'] / need:.3f}",
                               gb(r["peak_growth"]), growth, ratio])
    same, n = exact_count(rows)
    print(f"\nruns with read == slice + replicated to the byte (sequential and shard-on-load): {same} of {n}")
    short = "flux2-short" if args.set == "flux2" else "flux-short"
    lts = {r["shard_modulation"]: r for r in measured if r["mode"] == "load-then-shard" and label(r)[0] == short}
    sol = {r["shard_modulation"]: r for r in measured if r["mode"] == "shard-on-load" and label(r)[0] == short}
    for k in lts:
        print(f"\nload-then-shard / shard-on-load peak RSS growth at tp 4 (AdaLN {'sharded' if k else 'replicated'}): "
              f"{lts[k]['peak_growth'] / sol[k]['peak_growth']:.2f}x; time {lts[k]['seconds'] / sol[k]['seconds']:.2f}x")
    if args.inspect:
        report_inspect(args, rows)


def report_inspect(args, rows):
    """--flux2: inspect's bytes per rank against what `bench load` planned and read (rank 1)."""
    print("\nBytes per rank: `tprun inspect DIR --tp N --json` (components[0].tp.bytes_per_rank) against "
          "`tprun bench load` (rank 1, shard-on-load):\n")
    tprun_tools.table_header(["model", "checkpoint (GB)", "tp", "inspect: bytes per rank (GB, rank 0 .. tp-1)",
                              "bench load planned, rank 1 (GB)", "bench load read, rank 1 (GB)", "equal"])
    extra = read_lines(args.bytes) if args.bytes else []
    loads = {(label(r)[0], r["tp"]): r for r in rows + extra
             if r["mode"] == "shard-on-load" and not r["shard_modulation"] and r["checkpoint_bytes"] > 0}
    for i in read_lines(args.inspect):
        per_rank = i["tp_info"].get("bytes_per_rank") or []
        r = loads.get((i["model"], i["tp"]))
        name = NAMES.get(i["model"], i["model"])
        if not per_rank or r is None:
            tprun_tools.table_row([name, "-", i["tp"], i["tp_info"].get("error", "-"), "-", "-", "no"])
            continue
        need = r["slice_bytes"] + r["replicated_bytes"]
        ranks = sorted(set(per_rank))
        shown = gb(ranks[0]) if len(ranks) == 1 else " / ".join(gb(b) for b in per_rank)
        ok = per_rank[1] == need == r["read_bytes"]
        tprun_tools.table_row([name, f"{r['checkpoint_bytes'] / 1e9:.2f}", i["tp"], f"{shown} ({per_rank[1]} B)",
                               gb(need), f"{gb(r['read_bytes'])} ({r['read_bytes']} B)", "yes" if ok else "NO"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("rank-bytes", help="inspect JSON (stdin) -> bytes rank 1 keeps")
    sub.add_parser("keep-bytes", help="plan JSON (stdin) -> slice + replicated bytes")
    i = sub.add_parser("inspect-line", help="inspect JSON (stdin) -> one JSON line")
    i.add_argument("tp", type=int)
    i.add_argument("--model")
    r = sub.add_parser("report", help="the runs table of any set")
    r.add_argument("results")
    r.add_argument("set", choices=["flux1", "flux2", "mistral", "qwen-image", "wan"])
    r.add_argument("inspect", nargs="?", default="")
    r.add_argument("bytes", nargs="?", default="")
    m = sub.add_parser("report-mistral", help="the Mistral set's tables")
    for name in ("results", "plans", "inspect", "folder"):
        m.add_argument(name)
    for set_name in ("qwen-image", "wan"):
        q = sub.add_parser(f"report-{set_name}", help=f"the {set_name} set's bytes table")
        for name in ("results", "plans", "inspect"):
            q.add_argument(name)
    args = ap.parse_args()
    {"rank-bytes": rank_bytes, "keep-bytes": keep_bytes, "inspect-line": inspect_line, "report": report,
     "report-mistral": report_mistral, "report-qwen-image": report_qwen_image, "report-wan": report_wan}[args.cmd](args)


if __name__ == "__main__":
    main()
