"""tools/bench_batch's Python (--flux2-klein, --qwen-image, --wan): the diffusers rows and the report.

  python tools/py/bench_batch.py diffusers-row LAYOUT PROCESSES THREADS WALL OUT
      prints one JSON row from OUT/timing-*.json (what tools/py/bench_batch_diffusers.py run wrote,
      one file per process) and the whole-process wall seconds the caller measured
  python tools/py/bench_batch.py report ROWS WORKDIR
      the table (each row's fastest run, with the median and range when repeated) and the images
      (videos: every frame) of every tprun layout against diffusers' (WORKDIR/diffusers-dp1,
      WORKDIR/diffusers-dp2)

tools/bench_batch runs both (`tools/bench_batch --help` describes the benchmark).
"""
import argparse
import glob
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tprun_tools  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def diffusers_row(args):
    t = []
    for path in sorted(glob.glob(f"{args.out}/timing-*.json")):
        with open(path) as f:
            t.append(json.loads(f.read()))
    print(json.dumps({"runner": "diffusers", "layout": args.layout, "np": int(args.processes),
                      "threads": int(args.threads), "bind": "-", "images": sum(x["images"] for x in t),
                      "wall": float(args.wall), "loop": max(x["loop_s"] for x in t),
                      "import": max(x["import_s"] for x in t), "load": max(x["load_s"] for x in t), "dir": args.out}))


def compare(a, b):
    """bench_batch_diffusers.py compare of two runs' images (videos/: every frame of every video), as one
    table cell."""
    sub = "videos" if os.path.isdir(os.path.join(a, "videos")) else "images"
    out = subprocess.run([sys.executable, os.path.join(HERE, "bench_batch_diffusers.py"), "compare",
                          os.path.join(a, sub), os.path.join(b, sub)], capture_output=True, text=True)
    c = json.loads(out.stdout)
    bad = f" ({'; '.join(c['problems'])})" if c["problems"] else ""
    return f"{c['max_abs_diff_uint8']} ({c['identical']} of {c['images']} identical){bad}"


def report(args):
    rows = tprun_tools.read_json_lines(args.rows)
    groups = {}
    for r in rows:
        groups.setdefault((r["runner"], r["layout"]), []).append(r)
    # Other processes on the machine only ever add time: each row is its fastest
    # run (the median and the range of the wall times beside it when repeated).
    tprun_tools.table_header(["runner", "layout", "processes x threads", "images",
                              "wall s (whole process; median, range)", "images/s (whole process)",
                              "start-up + load s", "loop s", "loop images/s", "runner overhead"])
    for (runner, layout), g in groups.items():
        g = sorted(g, key=lambda r: r["wall"])
        r, med = g[0], g[len(g) // 2]
        walls = f"{r['wall']:.2f}" if len(g) == 1 else \
            f"{r['wall']:.2f} ({med['wall']:.1f}; {g[0]['wall']:.1f}–{g[-1]['wall']:.1f}, n={len(g)})"
        over = f"{r['overhead']:.2f} %" if "overhead" in r else "-"
        tprun_tools.table_row([runner, layout, f"{r['np']} x {r['threads']}", r["images"], walls,
                               f"{r['images'] / r['wall']:.3f}", f"{r['wall'] - r['loop']:.2f}", f"{r['loop']:.2f}",
                               f"{r['images'] / r['loop']:.3f}", over])
    print("\nImages (uint8 RGB PNGs, every request, every frame of a video; the last run of each row): max abs "
          "difference (of 255) from diffusers' with 2 threads (dp 1) and with 1 thread per process (dp 2):\n")
    tprun_tools.table_header(["images", "vs diffusers dp 1 (1 x 2)", "vs diffusers dp 2 (2 x 1)"])
    d1, d2 = args.work + "/diffusers-dp1", args.work + "/diffusers-dp2"
    seen = set()
    for r in rows:
        if r["dir"] in seen or r["dir"] in (d1, d2):
            continue
        seen.add(r["dir"])
        tprun_tools.table_row([f"{r['runner']} {r['layout']}", compare(d1, r["dir"]), compare(d2, r["dir"])])
    tprun_tools.table_row(["diffusers dp 2", compare(d1, d2), "-"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("diffusers-row", help="one diffusers row (JSON) from its processes' timing files")
    for name in ("layout", "processes", "threads", "wall", "out"):
        d.add_argument(name)
    r = sub.add_parser("report", help="the tables")
    r.add_argument("rows")
    r.add_argument("work")
    args = ap.parse_args()
    (diffusers_row if args.cmd == "diffusers-row" else report)(args)


if __name__ == "__main__":
    main()
