"""tools/bench_plan_check's row: the planner's peak against a run's measured peak RSS.

  python tools/py/bench_plan_check.py row WORKDIR TAG MODEL SIZE TP PHASES
      reads every rank's GNU time file WORKDIR/rss-TAG.<rank> (%M, KiB) and the planner's JSON
      WORKDIR/plan-TAG.json (`tprun plan JOB --world TP --json`), and prints one markdown row:
      the largest rank's peak, the candidate of that tp and phases, and planner / measured

tools/bench_plan_check runs it (`tools/bench_plan_check --help` describes the benchmark).
"""
import argparse
import glob
import json
import os
import sys

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tprun_tools  # noqa: E402


def row(args):
    peaks = []
    for path in glob.glob(f"{args.work}/rss-{args.tag}.*"):
        with open(path) as f:
            peaks.append(int(f.read().split()[-1]) * 1024)
    with open(f"{args.work}/plan-{args.tag}.json") as f:
        plan = json.load(f)
    c = [c for c in plan["candidates"] if c["tp"] == args.tp and c["stages"] == args.phases][0]
    mib = lambda b: b / 2**20  # noqa: E731
    tprun_tools.table_row([args.model, f"{args.size}²", args.tp, args.phases, f"{mib(max(peaks)):.0f}",
                           f"{mib(c['peak']):.0f}", f"{c['peak'] / max(peaks):.2f}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row", help="one table row")
    r.add_argument("work")
    r.add_argument("tag")
    r.add_argument("model")
    r.add_argument("size")
    r.add_argument("tp", type=int)
    r.add_argument("phases")
    row(ap.parse_args())


if __name__ == "__main__":
    main()
