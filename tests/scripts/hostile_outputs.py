#!/usr/bin/env python3
"""Hostile input, outputs: every path tprun writes is checked before any work; never the model, never a file
the run reads, never a file tprun did not write.

Cases (one ctest entry each; `hostile_outputs.py TPRUN MPIRUN CASE`). Every refusal: exit 3 on every
rank, the message names the option and the path, the target's bytes unchanged (sha256), nothing new
in the model folder, and no weight loaded.
  out_onto_model          generate --out / --out-tensors and forward --out onto the transformer's
                          weights, into the model folder, and through a symlink / hard link to a weight
  status_file_onto_inputs run --status-file onto the weights, the manifest, the requests file, the
                          job's results.jsonl, and a new file inside the model folder
  out_existing_foreign    an existing PNG / safetensors / status file that tprun did not write is refused;
                          those tprun wrote are replaced (a second generate, a second run)
  lock_symlink            an output folder whose .tprun.lock is a symlink (to a victim file) or a folder:
                          refused naming the lock path, the victim intact
  disk_path_relative_and_inside_model
                          memory.offload.disk_path in a manifest is relative to the manifest's folder
                          (not the current one); inside the model folder, or an input, it is refused
                          naming the manifest and the key (offload_folder too)
  offload_folder_without_map
                          memory.offload_folder without a device map: a config error naming the key
                          (manifest and generate --memory)
  run_foreign_png         run over out/images/<id>.png that tprun did not write (a user's PNG, a text file,
                          a symlink to a user's PNG): refused before any weight loads, naming the file and
                          "move it away", the file unchanged; a rerun over tprun's own PNGs still replaces them
  run_symlinked_entries   images/, store/, embeddings/, results.jsonl and a --shard chunk folder inside the
                          output folder as symlinks to a victim elsewhere: refused naming the path, nothing
                          written through them
  log_dir                 --log-dir into the model folder (or a component folder of it) is refused and makes
                          nothing there; a rank-0000.log symlink or a user's file there is refused, the target
                          unchanged; a rerun appends to tprun's own log
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import (  # noqa: E402
    Harness, jsonl, prompt_rows, read, run_cases, tiny_flux, write, write_manifest)

H = None
WEIGHTS = os.path.join("transformer", "diffusion_pytorch_model.safetensors")


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tree_hashes(folder):
    """{relative path: sha256} of every file below `folder` (what must not change)."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, folder)] = sha(p) if os.path.isfile(p) else "not a file"
    return out


def tiny_model(work):
    return tiny_flux(H.tprun, os.path.join(work, "model"))


def manifest(path, model, requests, out, memory=""):
    """The shared job manifest at tp 1, one step and 16 tokens; `memory` (a [memory] table) after [output]."""
    return write_manifest(path, model, requests, out, parallel={"tp": 1},
                          defaults={"steps": 1, "max_sequence_length": 16}, tail=memory)


def requests(path, n=2):
    return jsonl(path, prompt_rows(n, [f"a small red boat {i}" for i in range(n)], prefix="r"))


def gen_args(model, *extra):
    return ["generate", "--model", model, "--prompt", "a red boat", "--height", "32", "--width", "32",
            "--steps", "1", "--max-sequence-length", "16", *extra]


def refused(label, args, option, path, protect, model, np_=2, want=None, cwd=None):
    """`args` ends with exit 3 on every rank naming `option` and `path` (or `want`), no weight loaded,
    and leaves every file in `protect` and the model folder byte for byte as it was."""
    before = {p: sha(p) for p in protect if os.path.isfile(p)}
    model_before = tree_hashes(model)
    H.expect_config_error(label, args, want or f"{option} {path}", np_=np_, absent=f"loaded {model}")
    for p, h in before.items():
        H.check(os.path.isfile(p) and sha(p) == h, f"{label}: {p} unchanged")
    H.check(tree_hashes(model) == model_before, f"{label}: the model folder unchanged (no file added or changed)")


def out_onto_model(work):
    model = tiny_model(work)
    weights = os.path.join(model, WEIGHTS)
    refused("generate --out onto the weights", gen_args(model, "--out", weights), "--out", weights, [weights], model)
    refused("generate --out-tensors onto the weights", gen_args(model, "--out-tensors", weights), "--out-tensors",
            weights, [weights], model)
    inside = os.path.join(model, "transformer", "new.png")
    refused("generate --out, a new file inside the model", gen_args(model, "--out", inside), "--out", inside, [],
            model)
    H.check(not os.path.exists(inside), "generate --out inside the model: no file made")
    dotted = os.path.join(work, "elsewhere", "..", "model", WEIGHTS)
    os.makedirs(os.path.join(work, "elsewhere"))
    refused("generate --out through '..'", gen_args(model, "--out", dotted), "--out", dotted, [weights], model)
    link = os.path.join(work, "link.png")
    os.symlink(weights, link)
    refused("generate --out, a symlink to the weights", gen_args(model, "--out", link), "--out", link, [weights], model)
    hard = os.path.join(work, "hard.safetensors")
    os.link(weights, hard)
    refused("generate --out-tensors, a hard link to the weights", gen_args(model, "--out-tensors", hard),
            "--out-tensors", hard, [weights], model)
    os.symlink(os.path.join(model, "transformer"), os.path.join(work, "tdir"))
    via_dir = os.path.join(work, "tdir", "x.png")
    refused("generate --out through a symlinked folder into the model", gen_args(model, "--out", via_dir), "--out",
            via_dir, [], model)
    inputs = os.path.join(work, "in.safetensors")
    cfg = json.load(open(os.path.join(model, "transformer", "config.json")))
    save_file({"hidden_states": torch.randn(1, 4, cfg["in_channels"]),
               "encoder_hidden_states": torch.randn(1, 3, cfg["joint_attention_dim"]),
               "pooled_projections": torch.randn(1, cfg["pooled_projection_dim"]),
               "timestep": torch.tensor([0.5]), "img_ids": torch.zeros(4, 3), "txt_ids": torch.zeros(3, 3)}, inputs)
    fwd = ["forward", "--model", model, "--component", "transformer", "--inputs", inputs, "--tp", "2"]
    refused("forward --out onto the weights", fwd + ["--out", weights], "--out", weights, [weights, inputs], model)
    refused("forward --out onto its --inputs", fwd + ["--out", inputs], "--out", inputs, [weights, inputs], model)


def status_file_onto_inputs(work):
    model = tiny_model(work)
    weights = os.path.join(model, WEIGHTS)
    req = requests(os.path.join(work, "r.jsonl"))
    out = os.path.join(work, "out")
    os.makedirs(out)
    log = write(os.path.join(out, "results.jsonl"), "")  # an earlier run's log (empty)
    m = manifest(os.path.join(work, "job.toml"), model, req, out)
    run = ["run", m, "--progress", "none"]
    for label, target in [("the weights", weights), ("the manifest", m), ("the requests file", req),
                          ("the job's results.jsonl", log),
                          ("a new file in the model folder", os.path.join(model, "status.json"))]:
        refused(f"run --status-file onto {label}", run + ["--status-file", target], "--status-file", target,
                [weights, m, req, log], model)
    H.check(not os.path.exists(os.path.join(model, "status.json")), "no status file made in the model folder")
    # A symlink to the manifest and a chunk's results.jsonl (--shard writes into out/shard-0-of-2).
    link = os.path.join(work, "status-link")
    os.symlink(m, link)
    refused("run --status-file, a symlink to the manifest", run + ["--status-file", link], "--status-file", link, [m],
            model)
    chunk_log = os.path.join(out, "shard-0-of-2", "results.jsonl")
    os.makedirs(os.path.dirname(chunk_log))
    refused("run --shard --status-file onto the chunk's results.jsonl",
            run + ["--shard", "0/2", "--status-file", chunk_log], "--status-file", chunk_log, [m], model)


def out_existing_foreign(work):
    model = tiny_model(work)
    png, tensors = os.path.join(work, "a.png"), os.path.join(work, "a.safetensors")
    rc, log = H.run(gen_args(model, "--out", png, "--out-tensors", tensors), np_=2)
    H.check(rc == 0, f"generate into new files: exit {rc}" + ("" if rc == 0 else log[-1500:]))
    rc, log = H.run(gen_args(model, "--out", png, "--out-tensors", tensors, "--seed", "3"), np_=2)
    H.check(rc == 0, f"generate again over its own PNG and tensors: exit {rc}" + ("" if rc == 0 else log[-1500:]))
    from PIL import Image
    foreign_png = os.path.join(work, "photo.png")
    Image.new("RGB", (8, 8), (10, 20, 30)).save(foreign_png)
    refused("generate --out onto a PNG tprun did not write", gen_args(model, "--out", foreign_png), "--out",
            foreign_png, [foreign_png], model)
    notes = write(os.path.join(work, "notes.txt"), "my notes\n")
    refused("generate --out onto a text file", gen_args(model, "--out", notes), "--out", notes, [notes], model)
    foreign_st = os.path.join(work, "theirs.safetensors")
    save_file({"w": torch.ones(3)}, foreign_st)
    refused("generate --out-tensors onto a safetensors tprun did not write",
            gen_args(model, "--out-tensors", foreign_st), "--out-tensors", foreign_st, [foreign_st], model)
    refused("generate --out and --out-tensors one file", gen_args(model, "--out", png, "--out-tensors", png),
            "--out-tensors", png, [png], model)
    # --status-file: only over a file that holds a tprun status.
    req = requests(os.path.join(work, "r.jsonl"), n=1)
    m = manifest(os.path.join(work, "job.toml"), model, req, os.path.join(work, "out"))
    refused("run --status-file onto a text file", ["run", m, "--progress", "none", "--status-file", notes],
            "--status-file", notes, [notes], model)
    status = os.path.join(work, "status.json")
    for attempt in ("a new status file", "over its own status file"):
        rc, log = H.run(["run", m, "--progress", "none", "--status-file", status], np_=2)
        ok = rc == 0 and json.load(open(status)).get("exit_code") == 0
        H.check(ok, f"run --status-file, {attempt}: exit {rc}" + ("" if ok else log[-1500:]))


def lock_symlink(work):
    model = tiny_model(work)
    req = requests(os.path.join(work, "r.jsonl"), n=1)
    out = os.path.join(work, "out")
    os.makedirs(out)
    victim = write(os.path.join(work, "victim.txt"), "precious data\n")
    lock = os.path.join(out, ".tprun.lock")
    os.symlink(victim, lock)
    m = manifest(os.path.join(work, "job.toml"), model, req, out)
    refused("a .tprun.lock that is a symlink", ["run", m, "--progress", "none"], "lock", lock, [victim], model,
            want=f"lock file {lock} is a symbolic link")
    H.check(os.path.islink(lock) and os.readlink(lock) == victim, "the lock symlink left as it was")
    os.remove(lock)
    os.symlink(os.path.join(work, "missing-target"), lock)  # dangling: O_CREAT would make the target
    refused("a .tprun.lock that is a dangling symlink", ["run", m, "--progress", "none"], "lock", lock, [], model,
            want=f"lock file {lock} is a symbolic link")
    H.check(not os.path.exists(os.path.join(work, "missing-target")), "no file made at the dangling link's target")
    os.remove(lock)
    os.mkdir(lock)
    refused("a .tprun.lock that is a folder", ["run", m, "--progress", "none"], "lock", lock, [], model,
            want=f"lock file {lock} is not a regular file")


def disk_path_relative_and_inside_model(work):
    model = tiny_model(work)
    jobdir, here = os.path.join(work, "job"), os.path.join(work, "cwd")
    os.makedirs(jobdir)
    os.makedirs(here)
    req = requests(os.path.join(jobdir, "r.jsonl"), n=1)
    offload = '[memory]\noffload = {{ type = "block_level", blocks_per_group = 1, to = "disk", disk_path = "{}" }}\n'
    m = manifest(os.path.join(jobdir, "job.toml"), model, "r.jsonl", "out", memory=offload.format("cache"))
    p = subprocess.run([H.mpirun, "--oversubscribe", "-np", "1", H.tprun, "run", m, "--progress", "none",
                        "--log-dir", ""], cwd=here, capture_output=True, text=True, timeout=300)
    H.check(p.returncode == 0, f"run with a relative disk_path: exit {p.returncode}"
            + ("" if p.returncode == 0 else (p.stdout + p.stderr)[-1500:]))
    in_job = os.path.isdir(os.path.join(jobdir, "cache")) and os.listdir(os.path.join(jobdir, "cache"))
    H.check(bool(in_job), "disk_path 'cache' resolved from the manifest's folder: job/cache holds the groups")
    H.check(not os.path.exists(os.path.join(here, "cache")), "nothing written at cache/ in the current folder")
    for label, disk in [("the model folder", model), ("inside the model folder", os.path.join(model, "transformer")),
                        ("relative, into the model", "../model/offload"), ("the requests file", req)]:
        bad = manifest(os.path.join(jobdir, "bad.toml"), model, "r.jsonl", "out", memory=offload.format(disk))
        shown = os.path.normpath(os.path.join(jobdir, disk))
        refused(f"memory.offload.disk_path {label}", ["run", bad, "--progress", "none"], "", "", [req], model,
                want=f"{bad}: memory.offload.disk_path {shown}")
    H.check(not os.path.exists(os.path.join(model, "offload")), "no offload folder made in the model")
    mapped = manifest(os.path.join(jobdir, "map.toml"), model, "r.jsonl", "out",
                      memory=f'[memory]\ndevice_map = "balanced"\noffload_folder = "{model}/vae"\n')
    refused("memory.offload_folder inside the model", ["run", mapped, "--progress", "none"], "", "", [], model,
            want=f"{mapped}: memory.offload_folder {model}/vae")
    refused("generate --memory offload.disk_path inside the model",
            gen_args(model, "--out", os.path.join(work, "g.png"), "--memory",
                     f'offload={{type="block_level", to="disk", disk_path="{model}"}}'),
            "--memory offload.disk_path", model, [], model)


def offload_folder_without_map(work):
    model = tiny_model(work)
    req = requests(os.path.join(work, "r.jsonl"), n=1)
    m = manifest(os.path.join(work, "job.toml"), model, req, os.path.join(work, "out"),
                 memory=f'[memory]\noffload_folder = "{work}/spill"\n')
    refused("offload_folder without a device map (manifest)", ["run", m, "--progress", "none"], "", "", [], model,
            want="memory.offload_folder")
    rc, log = H.run(["run", m, "--progress", "none"], np_=2, timeout=120)
    H.check("device_map" in log, "the message says it needs memory.device_map")
    refused("offload_folder without a device map (generate --memory)",
            gen_args(model, "--out", os.path.join(work, "g.png"), "--memory", f"offload_folder={work}/spill"),
            "", "", [], model, want="offload_folder")
    H.check(not os.path.exists(os.path.join(work, "spill")), "no spill folder made")


def other_commands(work):
    """The file tools and the benchmark go through the same check: `shard` DST inside its source,
    `convert --force` onto its source file, `bench step --out` onto a weight or its --inputs."""
    model = tiny_model(work)
    transformer = os.path.join(model, "transformer")
    weights = os.path.join(model, WEIGHTS)
    def tool_refused(label, args, path):  # the file tools run as one process (no --log-dir)
        before = tree_hashes(model)
        r = subprocess.run([H.tprun, *args], capture_output=True, text=True, timeout=120)
        H.check(r.returncode == 3 and f"DST {path}" in r.stderr + r.stdout,
                f"{label}: exit {r.returncode} (want 3) naming DST {path}\n{(r.stderr + r.stdout)[-600:]}")
        H.check(tree_hashes(model) == before, f"{label}: the model folder unchanged")

    inside = os.path.join(transformer, "resharded")
    tool_refused("shard DST inside its source", ["shard", transformer, inside], inside)
    H.check(not os.path.exists(inside), "shard DST inside the source: no folder made")
    h5 = os.path.join(work, "t.h5")
    os.link(weights, h5)  # an .h5 name that is the weights file
    tool_refused("convert --force onto its source", ["convert", weights, h5, "--force"], h5)
    inputs = os.path.join(work, "in.safetensors")
    cfg = json.load(open(os.path.join(transformer, "config.json")))
    save_file({"hidden_states": torch.randn(1, 4, cfg["in_channels"]),
               "encoder_hidden_states": torch.randn(1, 3, cfg["joint_attention_dim"]),
               "pooled_projections": torch.randn(1, cfg["pooled_projection_dim"]),
               "timestep": torch.tensor([0.5]), "img_ids": torch.zeros(4, 3), "txt_ids": torch.zeros(3, 3)}, inputs)
    bench = ["bench", "step", "--model", transformer, "--inputs", inputs, "--iters", "1", "--warmup", "0"]
    refused("bench step --out onto the weights", bench + ["--out", weights], "--out", weights, [weights, inputs],
            model)
    refused("bench step --out onto its --inputs", bench + ["--out", inputs], "--out", inputs, [weights, inputs],
            model)


def user_png(path, colour=(10, 20, 30)):
    """A PNG written by someone else (PIL: no tprun Software chunk); returns `path`."""
    from PIL import Image
    Image.new("RGB", (8, 8), colour).save(path)
    return path


def run_foreign_png(work):
    model = tiny_model(work)
    req = requests(os.path.join(work, "r.jsonl"))
    out = os.path.join(work, "out")
    images = os.path.join(out, "images")
    os.makedirs(images)
    m = manifest(os.path.join(work, "job.toml"), model, req, out)
    run = ["run", m, "--progress", "none"]
    mine = user_png(os.path.join(images, "r0.png"))
    refused("run over a user's PNG in images/", run, "", "", [mine], model,
            want=f"request 'r0' would write {mine}, which exists and is not a PNG tprun wrote")
    rc, log = H.run(run, np_=2, timeout=120)
    H.check("move it away" in log, "the message says what to do (move it away / another --out)")
    os.remove(mine)
    notes = write(os.path.join(images, "r1.png"), "my notes\n")
    refused("run over a text file named r1.png", run, "", "", [notes], model, want=f"would write {notes}")
    os.remove(notes)
    photo = user_png(os.path.join(work, "photo.png"))
    os.symlink(photo, os.path.join(images, "r0.png"))
    refused("run over a symlink to a user's PNG", run, "", "", [photo], model,
            want=f"would write {os.path.join(images, 'r0.png')}")
    H.check(os.path.islink(os.path.join(images, "r0.png")), "the symlink is left as it was")
    os.remove(os.path.join(images, "r0.png"))
    # tprun's own PNGs: a rerun replaces them (the log removed, so both requests run again).
    rc, log = H.run(run, np_=2)
    H.check(rc == 0, f"a run into images/ with nothing foreign: exit {rc}" + ("" if rc == 0 else log[-1500:]))
    first = os.stat(os.path.join(images, "r0.png")).st_ino
    os.remove(os.path.join(out, "results.jsonl"))
    rc, log = H.run(run, np_=2)
    H.check(rc == 0 and os.stat(os.path.join(images, "r0.png")).st_ino != first,
            f"a rerun replaces tprun's own PNGs: exit {rc}" + ("" if rc == 0 else log[-1500:]))
    H.check(not [f for f in os.listdir(images) if ".tmp" in f], "no temporary left in images/")


def run_symlinked_entries(work):
    model = tiny_model(work)
    req = requests(os.path.join(work, "r.jsonl"), n=1)
    victim = os.path.join(work, "victim")
    os.makedirs(victim)
    victim_log = write(os.path.join(work, "victim.jsonl"), "precious\n")
    out = os.path.join(work, "out")
    m = manifest(os.path.join(work, "job.toml"), model, req, out)
    run = ["run", m, "--progress", "none"]
    for name, target, extra in [("images", victim, []), ("results.jsonl", victim_log, []),
                                ("store", victim, ["--set", 'output.formats=["png","hdf5"]']),
                                ("embeddings", victim, [])]:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        link = os.path.join(out, name)
        os.symlink(target, link)
        refused(f"run with {name} a symlink", run + extra, "", "", [victim_log], model,
                want=f"{link} is a symbolic link")
        H.check(os.listdir(victim) == [] and read(victim_log) == b"precious\n",
                f"{name} a symlink: nothing written through it")
    # A job-array chunk folder that is a symlink.
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    chunk = os.path.join(out, "shard-0-of-1")
    os.symlink(victim, chunk)
    refused("run --shard into a symlinked chunk folder", run + ["--shard", "0/1"], "", "", [], model,
            want=f"{chunk} is a symbolic link")
    H.check(os.listdir(victim) == [], "the chunk symlink: nothing written through it")


def log_dir(work):
    model = tiny_model(work)
    req = requests(os.path.join(work, "r.jsonl"), n=1)
    out = os.path.join(work, "out")
    m = manifest(os.path.join(work, "job.toml"), model, req, out)

    def run(logs, np_=2):
        cmd = [H.mpirun, "--oversubscribe", "-np", str(np_), H.tprun, "run", m, "--progress", "none",
               "--log-dir", logs]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return p.returncode, p.stdout + p.stderr

    for label, logs in [("the model folder", model), ("a component folder of the model",
                                                      os.path.join(model, "transformer")),
                        ("a new folder inside the model", os.path.join(model, "logs"))]:
        before = tree_hashes(model)
        rc, log = run(logs)
        H.check(rc == 3 and f"--log-dir {logs}" in log and "model folder" in log,
                f"--log-dir {label}: exit {rc} (want 3) naming it\n{log[-800:]}")
        H.check(tree_hashes(model) == before and not os.path.exists(os.path.join(model, "logs")),
                f"--log-dir {label}: nothing written into the model")
    logs = os.path.join(work, "logs")
    os.makedirs(logs)
    victim = write(os.path.join(work, "victim.txt"), "precious\n")
    rank0 = os.path.join(logs, "rank-0000.log")
    os.symlink(victim, rank0)
    rc, log = run(logs)
    H.check(rc == 3 and f"{rank0} is a symbolic link" in log, f"a rank-0000.log symlink: exit {rc} (want 3)"
            f" naming it\n{log[-800:]}")
    H.check(read(victim) == b"precious\n", "the symlink's target unchanged")
    os.remove(rank0)
    write(rank0, "my own notes\n")
    rc, log = run(logs)
    H.check(rc == 3 and f"{rank0} exists and is not a log tprun wrote" in log,
            f"a user's rank-0000.log: exit {rc} (want 3)\n{log[-800:]}")
    H.check(read(rank0) == b"my own notes\n", "the user's file unchanged")
    os.remove(rank0)
    rc, log = run(logs)
    H.check(rc == 0, f"a fresh log folder: exit {rc}" + ("" if rc == 0 else log[-1500:]))
    first = read(rank0)
    rc, log = run(logs)
    H.check(rc == 0 and read(rank0).startswith(first) and len(read(rank0)) > len(first),
            f"a rerun appends to tprun's own log: exit {rc}" + ("" if rc == 0 else log[-1500:]))


CASES = {f.__name__: f for f in [out_onto_model, status_file_onto_inputs, out_existing_foreign, lock_symlink,
                                 disk_path_relative_and_inside_model, offload_folder_without_map, other_commands,
                                 run_foreign_png, run_symlinked_entries, log_dir]}

if __name__ == "__main__":
    H = Harness(sys.argv[1], sys.argv[2])
    sys.exit(run_cases(H, CASES, "hostile-outputs"))
