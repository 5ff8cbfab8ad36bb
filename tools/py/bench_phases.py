"""tools/bench_phases' Python: one run's row from its log and GNU time files, and the report.

  python tools/py/bench_phases.py row ROWS MODE TP THREADS WALL LOG OUT RSS_PREFIX
      appends one JSON line to ROWS: the job's "summary: N run (F failed) in X s, Y img/s" line
      of LOG, every rank's peak RSS from RSS_PREFIX.<rank> (GNU time's %M, KiB), the wall seconds
  python tools/py/bench_phases.py report ROWS WORKDIR
      two markdown tables: per phases mode and tp (each row's fastest run, the largest peak of its
      runs, the planner's peak from WORKDIR/plan-MODE-tpTP.json against it), and per tp the ratios
      staged / together with whether both modes' PNGs are the same

tools/bench_phases runs both (`tools/bench_phases --help` describes the benchmark).
"""
import argparse
import glob
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tprun_tools  # noqa: E402


def row(args):
    with open(args.log) as f:
        text = f.read()
    m = re.search(r"summary: (\d+) run \((\d+) failed\) in ([0-9.]+) s, ([0-9.]+) img/s", text)
    if not m:
        sys.exit(f"no summary line in {args.log}")
    peaks = []
    for path in sorted(glob.glob(args.rss + ".*"), key=lambda f: int(f.rsplit(".", 1)[1])):
        with open(path) as f:
            peaks.append(int(f.read().split()[-1]) * 1024)
    r = {"mode": args.mode, "tp": int(args.tp), "threads": int(args.threads), "images": int(m[1]), "failed": int(m[2]),
         "loop_s": float(m[3]), "loop_rate": float(m[4]), "wall": float(args.wall), "peaks": peaks, "dir": args.out}
    with open(args.rows, "a") as f:
        f.write(json.dumps(r) + "\n")
    print(json.dumps(r), file=sys.stderr)


def planned(work, tp, mode):
    """The planner's peak per rank for tp ranks at tp (dp 1) in this mode, or None."""
    path = os.path.join(work, f"plan-{mode}-tp{tp}.json")
    text = open(path).read() if os.path.exists(path) else ""
    if not text.strip():
        return None
    for c in json.loads(text).get("candidates", []):
        if c.get("tp") == tp and c.get("dp") == 1 and c.get("stages") == mode:
            return c.get("peak")
    return None


def images(d):
    return {os.path.relpath(f, d): f for f in glob.glob(os.path.join(d, "images", "*.png"))}


def report(args):
    import numpy as np
    from PIL import Image
    rows = tprun_tools.read_json_lines(args.rows)
    work = args.work
    gib = lambda b: b / 2**30  # noqa: E731
    best = {}
    for r in rows:  # each row's fastest run; its peak the largest of its runs
        key = (r["mode"], r["tp"])
        b = best.setdefault(key, dict(r))
        if r["wall"] < b["wall"]:
            b.update({k: v for k, v in r.items() if k != "peaks"})
        b["peaks"] = [max(x, y) for x, y in zip(b["peaks"], r["peaks"])]
        b["runs"] = b.get("runs", 0) + 1

    tprun_tools.table_header(["phases", "tp", "ranks x threads", "images", "peak RSS per rank (GiB)", "loop s",
                              "loop images/s", "whole process s", "images/s (whole process)", "planner peak (GiB)",
                              "planner / measured (max rank)"])
    for (mode, tp), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0] != "together")):
        p = planned(work, tp, mode)
        top = max(r["peaks"])
        ratio = f"{p / top:.2f} ({'within' if abs(p / top - 1) <= 0.15 else 'outside'} 15 %)" if p else "-"
        tprun_tools.table_row([mode, tp, f"{tp} x {r['threads']}", r["images"],
                               " / ".join(f"{gib(x):.2f}" for x in r["peaks"]), f"{r['loop_s']:.1f}",
                               f"{r['loop_rate']:.3f}", f"{r['wall']:.1f}", f"{r['images'] / r['wall']:.3f}",
                               f"{gib(p):.2f}" if p else "-", ratio])

    print()
    tprun_tools.table_header(["tp", "peak staged / together (target <= 0.6)",
                              "loop images/s staged / together (target >= 0.95)",
                              "whole-process images/s staged / together", "images: same pixels / same bytes"])
    for tp in sorted({tp for _, tp in best}):
        t, s = best.get(("together", tp)), best.get(("staged", tp))
        if not t or not s:
            continue
        peak = max(s["peaks"]) / max(t["peaks"])
        loop = s["loop_rate"] / t["loop_rate"]
        whole = (s["images"] / s["wall"]) / (t["images"] / t["wall"])
        a, b = images(t["dir"]), images(s["dir"])
        same_px = same_bytes = 0
        for name in sorted(set(a) & set(b)):
            same_bytes += open(a[name], "rb").read() == open(b[name], "rb").read()
            same_px += np.array_equal(np.asarray(Image.open(a[name])), np.asarray(Image.open(b[name])))
        tprun_tools.table_row([tp, f"{peak:.2f} ({'met' if peak <= 0.6 else 'not met'})",
                               f"{loop:.3f} ({'met' if loop >= 0.95 else 'not met'})", f"{whole:.3f}",
                               f"{same_px} / {same_bytes} of {len(a)}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row", help="append one run's row")
    for name in ("rows", "mode", "tp", "threads", "wall", "log", "out", "rss"):
        r.add_argument(name)
    p = sub.add_parser("report", help="print the tables")
    p.add_argument("rows")
    p.add_argument("work")
    args = ap.parse_args()
    (row if args.cmd == "row" else report)(args)


if __name__ == "__main__":
    main()
