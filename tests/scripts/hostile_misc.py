#!/usr/bin/env python3
"""Hostile input, smaller faults: a stepped Slurm array, --comm nccl on CPU ranks, the advice for a
manifest's parallel.device, unknown names in `forward --inputs`.

Cases (one ctest entry each; `hostile_misc.py TPRUN MPIRUN CASE`):
  slurm_stepped_array  --shard slurm in a `--array=0-10:2` array (SLURM_ARRAY_TASK_STEP=2, COUNT 6,
                       set directly: no Slurm needed): task k*2 runs chunk k of 6 (tasks 6-10 once
                       failed with "chunk 10 of 6"), the six chunks merge into every request done
                       once; an id off the step and an unevenly spaced array are config errors
                       naming the variables, no chunk folder written
  comm_nccl_cpu        --comm nccl where the ranks compute on the CPU (the default device on a host
                       without a GPU, and --device cpu): one rule, a config error (exit 3) on every
                       rank naming --comm nccl and the CPU (once an info line with the default
                       device and an error with --device cpu); --comm auto runs silently
  device_cuda_on_cpu   parallel.device = "cuda" on a host without a GPU: the error says what is wrong
                       (no GPU visible / no CUDA in this build) and what to do, not "set --device cuda"
  forward_unknown_input  `forward --inputs` with a tensor the model does not read (a mask under a
                       misspelt name, once dropped silently): refused on every rank naming the file,
                       the tensor and the inputs the class takes; no --out written; the right names run
  threads_same_image   a bf16 FLUX.2 [klein] job (init-model small, 64x64, one step) gives the same PNGs,
                       byte for byte, with --threads 1, 2 and 3 (libtorch once picked the VAE's fp32 1x1
                       convolution kernel by the thread count: one image 2-3 levels of 255 off)
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import (  # noqa: E402
    Harness, jsonl, prompt_rows, results, run_cases, tiny_flux, transformer_inputs, write_manifest)

H = None


def on_gpu_host():
    """True where the default device is a GPU (the CPU-host cases say SKIP there)."""
    rc, log = H.run(["env"], np_=1, timeout=120)
    return rc == 0 and "device cuda" in log


def slurm_stepped_array(work):
    model = tiny_flux(H.tprun, os.path.join(work, "model"))
    req = jsonl(os.path.join(work, "req.jsonl"), prompt_rows(6))
    out = os.path.join(work, "out")
    manifest = write_manifest(os.path.join(work, "job.toml"), model, req, out)
    array = {"SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "10", "SLURM_ARRAY_TASK_STEP": "2",
             "SLURM_ARRAY_TASK_COUNT": "6", "SLURM_ARRAY_JOB_ID": "77"}
    saved = dict(os.environ)
    try:
        os.environ.update(array)
        for task in range(0, 11, 2):
            os.environ["SLURM_ARRAY_TASK_ID"] = str(task)
            rc, log = H.run(["run", manifest, "--shard", "slurm", "--progress", "none"], np_=1)
            chunk = os.path.join(out, f"shard-{task // 2}-of-6")
            ok = rc == 0 and os.path.isdir(chunk)
            done = [r["id"] for r in results(chunk) if r["status"] == "done"] if ok else []
            H.check(ok and len(done) == 1,
                    f"SLURM_ARRAY_TASK_ID={task} (step 2): exit {rc}, chunk {task // 2} of 6 with one done request "
                    f"{done}" + ("" if ok else f"\n{log[-800:]}"))
        merged = os.path.join(work, "merged")
        chunks = [os.path.join(out, f"shard-{k}-of-6") for k in range(6)]
        r = subprocess.run([H.tprun, "merge-results", "--out", merged, *chunks], capture_output=True, text=True,
                           timeout=120)
        done = sorted(x["id"] for x in results(merged) if x["status"] == "done") if r.returncode == 0 else []
        H.check(done == [f"p{i}" for i in range(6)], f"merge-results of the six chunks: exit {r.returncode}, done {done}")
        before = sorted(os.listdir(out))
        # An id off the step (3 is not 0 + 2k) and an array that is not evenly spaced (--array=0,2,10:
        # MIN 0, MAX 10, COUNT 3): config errors naming the variables, nothing written.
        os.environ["SLURM_ARRAY_TASK_ID"] = "3"
        H.expect_config_error("SLURM_ARRAY_TASK_ID=3 with step 2", ["run", manifest, "--shard", "slurm"],
                              "SLURM_ARRAY_TASK_STEP=2", np_=2)
        os.environ.update({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_STEP": "1"})
        H.expect_config_error("an unevenly spaced array", ["run", manifest, "--shard", "slurm"],
                              "SLURM_ARRAY_TASK_MAX=10", np_=2)
        H.check(sorted(os.listdir(out)) == before, f"no chunk folder written by the refused tasks: {sorted(os.listdir(out))}")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def comm_nccl_cpu(work):
    if on_gpu_host():
        print("SKIP: the default device is a GPU here (the CPU-host rule is checked on CPU hosts)")
        return
    for extra in ([], ["--device", "cpu"]):
        what = " ".join(["--comm nccl", *extra])
        H.expect_config_error(what, ["env", "--comm", "nccl", *extra], "computes on the CPU", np_=2)
        rc, log = H.run(["env", "--comm", "nccl", *extra], np_=2, timeout=120)
        H.check("--comm auto" in log and "rank 0 computes on the CPU" in log,
                f"{what}: names the first CPU rank and the way out (--comm auto)")
    rc, log = H.run(["env", "--comm", "auto"], np_=2, timeout=120)
    H.check(rc == 0 and "--comm nccl" not in log,
            f"--comm auto on CPU ranks: exit {rc}, nothing said about NCCL" + ("" if rc == 0 else f"\n{log[-800:]}"))


def device_cuda_on_cpu(work):
    if on_gpu_host():
        print("SKIP: a GPU is visible here")
        return
    model = tiny_flux(H.tprun, os.path.join(work, "model"))
    req = jsonl(os.path.join(work, "req.jsonl"), prompt_rows(1))
    manifest = write_manifest(os.path.join(work, "job.toml"), model, req, os.path.join(work, "out"),
                              parallel={"device": '"cuda"'})
    H.expect_config_error("parallel.device = cuda on a CPU host", ["run", manifest], "parallel.device is 'cuda'",
                          np_=2)
    rc, log = H.run(["run", manifest], np_=1, timeout=120)
    says_why = "no GPU is visible" in log or "libtorch without CUDA" in log
    H.check(says_why and "set --device cuda" not in log and 'parallel.device = "cpu"' in log,
            "the error says what is wrong (no GPU visible / no CUDA) and how to run on the CPU, not 'set --device "
            "cuda'" + ("" if says_why else f"\n{log[-800:]}"))


def forward_unknown_input(work):
    import torch
    from safetensors.torch import save_file
    model = tiny_flux(H.tprun, os.path.join(work, "model"))
    good = transformer_inputs(model, "flux")
    good_file = os.path.join(work, "good.safetensors")
    save_file(good, good_file)
    bad_file = os.path.join(work, "typo.safetensors")
    save_file(dict(good, encoder_hidden_states_msk=torch.ones(1, good["encoder_hidden_states"].shape[1])), bad_file)
    out = os.path.join(work, "out.safetensors")
    args = ["forward", "--model", model, "--component", "transformer", "--out", out]
    rc, log = H.run([*args, "--inputs", bad_file], np_=2, timeout=180)
    lines = [l for l in log.splitlines() if "'encoder_hidden_states_msk' is not an input" in l]
    H.check(rc not in (0, None) and len(lines) >= 2 and bad_file in lines[0] and "encoder_hidden_states," in lines[0]
            and not os.path.exists(out),
            f"an unknown input name: exit {rc}, refused on {len(lines)} of 2 ranks naming the file and the inputs, "
            f"no --out" + ("" if lines else f"\n{log[-800:]}"))
    rc, log = H.run([*args, "--inputs", good_file], np_=2, timeout=180)
    H.check(rc == 0 and os.path.exists(out), f"the right names run: exit {rc}" + ("" if rc == 0 else f"\n{log[-800:]}"))


def threads_same_image(work):
    model = os.path.join(work, "klein")
    subprocess.run([H.tprun, "init-model", model, "--arch", "flux2-klein", "--preset", "small"], check=True,
                   stdout=subprocess.DEVNULL)
    req = jsonl(os.path.join(work, "req.jsonl"), prompt_rows(2))
    images = {}
    for threads in (1, 2, 3):
        out = os.path.join(work, f"out-{threads}")
        manifest = write_manifest(os.path.join(work, f"job-{threads}.toml"), model, req, out,
                                  defaults={"height": 64, "width": 64, "steps": 1})
        rc, log = H.run(["run", manifest, "--set", 'dtype="bf16"', "--threads", str(threads), "--progress", "none"],
                        np_=1, timeout=300)
        H.check(rc == 0, f"--threads {threads}: exit {rc}" + ("" if rc == 0 else f"\n{log[-800:]}"))
        if rc == 0:
            images[threads] = {i: open(os.path.join(out, "images", f"{i}.png"), "rb").read() for i in ("p0", "p1")}
    for threads in (2, 3):
        if 1 in images and threads in images:
            same = [i for i in ("p0", "p1") if images[1][i] == images[threads][i]]
            H.check(len(same) == 2, f"--threads {threads} and --threads 1 give the same PNGs byte for byte: {same} of p0, p1")


CASES = {"slurm_stepped_array": slurm_stepped_array, "comm_nccl_cpu": comm_nccl_cpu,
         "device_cuda_on_cpu": device_cuda_on_cpu, "forward_unknown_input": forward_unknown_input,
         "threads_same_image": threads_same_image}

if __name__ == "__main__":
    H = Harness(os.path.abspath(sys.argv[1]), sys.argv[2])
    sys.exit(run_cases(H, CASES, "tprun-hostile-misc"))
