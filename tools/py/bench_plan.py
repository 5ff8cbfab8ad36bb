"""tools/bench_plan's measurement: `tprun plan --json` on sparse pipeline folders for every world
size and memory per device; prints the chosen plan per cell (projected gain against keeping every
component resident with the smallest tp that fits) and the time of each call, wall and CPU.

  python tools/py/bench_plan.py WORKDIR --archs "A B" --worlds "1 2 4 8" --memory "24GB 80GB"
                                [--device cuda] [--video-sizes "480x832x81 720x1280x81"]

Image pipelines are planned at 1024x1024; the video pipelines (Wan) once per --video-sizes entry
HEIGHTxWIDTHxFRAMES (default 480p and 720p, 81 frames: Wan 2.1's and 2.2's own sizes).

WORKDIR/<arch> are the folders tools/make_sparse_pipeline.py wrote; the binary is TPRUN_BIN /
TPRUN_BUILD_DIR/bin/tprun (tools/py/tprun_tools.py). tools/bench_plan runs this.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # --help and the tools leave no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tprun_tools  # noqa: E402

NAMES = {"flux1-dev": "FLUX.1 [dev]", "flux2-klein-4b": "FLUX.2 [klein] 4B", "flux2-klein-9b": "FLUX.2 [klein] 9B",
         "flux2-dev": "FLUX.2 [dev]", "qwen-image": "Qwen-Image", "wan2.1-1.3b": "Wan2.1-T2V-1.3B",
         "wan2.1-14b": "Wan2.1-T2V-14B", "wan2.2-a14b": "Wan2.2-T2V-A14B"}
VIDEO = {"wan2.1-1.3b", "wan2.1-14b", "wan2.2-a14b"}  # planned per --video-sizes entry, with --frames


def sizes(arch, video_sizes):
    """[(label, plan size arguments)] of an arch: 1024x1024 for an image pipeline, each video size for Wan."""
    if arch not in VIDEO:
        return [("", ["--height", "1024", "--width", "1024"])]
    out = []
    for v in video_sizes:
        h, w, f = v.split("x")
        out.append((f" {h}x{w}, {f} frames", ["--height", h, "--width", w, "--frames", f]))
    return out


def timed(cmd):
    """(stdout, exit code, wall seconds, CPU seconds of the process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out.stdout, out.returncode, wall, cpu


def plan(tprun, work, arch, world, memory, device, size_args):
    """The planner's JSON (None where it printed none), wall seconds, CPU seconds of the process, exit code."""
    text, code, wall, cpu = timed([
        tprun, "plan", "--model", os.path.join(work, arch), "--world", str(world), "--device-memory", memory,
        "--device", device, "--dtype", "bf16"] + size_args + ["--batch", "1", "--json", "--log-level", "error"])
    text = text.strip()
    return (json.loads(text) if text.startswith("{") else None), wall, cpu, code


def cell(p, world):
    """One table cell: tp x dp, phases and the projected gain, or why there is none."""
    if p is None:
        return "(no output)"
    chosen = p.get("chosen")
    if not chosen:
        return "does not fit"
    resident = [c["tp"] for c in p["candidates"] if c["stages"] == "together" and c["fits"]]
    gain = f"{chosen['dp'] / (world // min(resident)):.2f}x" if resident else "only staged fits"
    return f"{chosen['tp']}x{chosen['dp']} {chosen.get('auto_stages', chosen['stages'])} ({gain})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("--archs", required=True, help="space-separated make_sparse_pipeline.py --arch names")
    ap.add_argument("--worlds", required=True, help="space-separated world sizes")
    ap.add_argument("--memory", required=True, help="space-separated memory per device (tprun plan --device-memory)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--video-sizes", default="480x832x81 720x1280x81",
                    help="HEIGHTxWIDTHxFRAMES entries the video pipelines are planned at")
    args = ap.parse_args()
    tprun, work, device = tprun_tools.tprun_binary(), args.work, args.device
    archs, worlds, memories = args.archs.split(), [int(w) for w in args.worlds.split()], args.memory.split()

    times, rows = {}, []
    video_sizes = args.video_sizes.split()
    for arch in archs:
        for size_label, size_args in sizes(arch, video_sizes):
            for memory in memories:
                cells = []
                for world in worlds:
                    p, wall, cpu, code = plan(tprun, work, arch, world, memory, device, size_args)
                    times.setdefault(arch, []).append((wall, cpu))
                    cells.append(cell(p, world))
                rows.append((NAMES.get(arch, arch) + size_label, memory, cells))

    print(f"Chosen plan per cell: tp x dp, phases (projected throughput against the smallest tp that fits with "
          f"every component resident: dp_chosen / dp_resident); bf16, 1024x1024 (video: the size named), batch 1, "
          f"--device {device}\n")
    tprun_tools.table(["pipeline", "memory per device"] + [f"world {w}" for w in worlds],
                      [[name, memory] + cells for name, memory, cells in rows])
    print("\n`tprun plan` per call (whole process), over the calls of each pipeline:\n")
    tprun_tools.table_header(["pipeline", "wall s median", "wall s max", "CPU s median", "CPU s max",
                              "target (< 2 s, FLUX.2 [dev]): median / max"])
    for arch in archs:
        w = [t[0] for t in times[arch]]
        c = [t[1] for t in times[arch]]
        verdict = lambda x: "met" if x < 2 else "not met"  # noqa: E731
        target = f"{verdict(statistics.median(w))} / {verdict(max(w))}" if arch == "flux2-dev" else "-"
        tprun_tools.table_row([NAMES.get(arch, arch), f"{statistics.median(w):.2f}", f"{max(w):.2f}",
                               f"{statistics.median(c):.2f}", f"{max(c):.2f}", target])
    # The floor: starting the process (libtorch's libraries) and parsing the options, no planning.
    floor = [timed([tprun, "plan", "--help"])[2:] for _ in range(5)]
    tprun_tools.table_row(["(process start: `tprun plan --help`, 5 calls)", f"{statistics.median(t[0] for t in floor):.2f}",
                           f"{max(t[0] for t in floor):.2f}", f"{statistics.median(t[1] for t in floor):.2f}",
                           f"{max(t[1] for t in floor):.2f}", "-"])
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"\nload average at the end: {load} (2 cores: wall times above the CPU times are waiting)")


if __name__ == "__main__":
    main()
