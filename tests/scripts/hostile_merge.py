#!/usr/bin/env python3
"""Hostile input for `tprun merge-results` and for resume.

Every case makes real chunks with `tprun run --shard I/N` on an init-model tiny FLUX.1 folder (once per
case), then hands merge-results or a resumed run something hostile. Nothing outside --out is ever
written; a refusal is exit 3 with one message naming the file and the record.

Cases (one ctest entry each; `hostile_merge.py TPRUN MPIRUN CASE`):
  path_escape        a record path "../../victim/x": refused naming the chunk's results.jsonl and the
                     record; the victim file and the file at the place outside --out untouched
  path_absolute      a record path naming an absolute file: refused the same way
  path_symlink       images/<id>.png a symlink to a PNG outside the chunk: refused naming the file
  out_is_chunk       --out equal to an input, or inside one: refused, the chunk's log byte for byte
                     as it was; --out holding the chunks (the run's output.dir) is fine
  chunk_running      a chunk whose .tprun.lock a running process holds (flock LOCK_EX): refused
  bad_image          a truncated PNG, then a PNG with a flipped IDAT byte (bad CRC): refused naming it
  atomic             a merge that fails part way (a chunk's image is missing) leaves --out as it was:
                     a new --out is not created, an existing one keeps its files
  missing_array_chunk  shard-0-of-3 and shard-2-of-3 without shard-1-of-3: refused naming the missing
                     chunk; --partial merges them with a warning naming it
  out_foreign_files  an existing --out holding a user's PNG at a merged image's place, or a user's
                     results.jsonl next to a hand-made .tprun-merged: refused naming the file, nothing
                     changed; a second merge into its own --out still replaces its files
  out_nested_symlink a record path images/sub/x.png whose folder in --out is a symlink to a victim
                     folder: refused naming it, nothing written there
  resume_duplicate_done  an id recorded `done` twice in results.jsonl: the resumed run is refused
                     naming file:line, the file as it was
  resume_foreign_path  a `done` record whose path leaves the output folder: refused naming file:line
  resume_bad_crc     a done image with a flipped IDAT byte runs again (and is whole afterwards)
  last_line_without_newline  a complete last record lacking only its newline is kept (no id runs
                     again); the next record goes on a line of its own; the file is not rewritten
"""
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import (  # noqa: E402
    Harness, jsonl, prompt_rows, read, results, run_cases, tiny_flux, write, write_manifest)

H = None


def job(work, n_requests=4, name="job"):
    """A tiny model (made once per case), a requests file with n_requests prompts and its manifest."""
    model = os.path.join(work, "model")
    if not os.path.isdir(model):
        tiny_flux(H.tprun, model)
    req = jsonl(os.path.join(work, f"{name}.jsonl"), prompt_rows(n_requests))
    out = os.path.join(work, "out")
    return write_manifest(os.path.join(work, f"{name}.toml"), model, req, out), out


def run(manifest, *extra, want=0):
    rc, log = H.run(["run", manifest, "--progress", "none", *extra], np_=1)
    if rc != want:
        raise SystemExit(f"FAIL tprun run {manifest} {' '.join(extra)}: exit {rc} (want {want})\n{log[-3000:]}")
    return log


def chunks(work, n=2, n_requests=4, only=None):
    """`tprun run --shard I/n` for each I (or those in `only`): the chunk folders, by index."""
    manifest, out = job(work, n_requests)
    dirs = {}
    for i in range(n) if only is None else only:
        run(manifest, "--shard", f"{i}/{n}")
        dirs[i] = os.path.join(out, f"shard-{i}-of-{n}")
    return dirs


def merge(out, *dirs, extra=()):
    r = subprocess.run([H.tprun, "merge-results", "--out", out, *extra, *dirs], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


def set_path(chunk, rid, path):
    """Rewrites the record of `rid` in chunk/results.jsonl to name `path`; returns its line number."""
    log = os.path.join(chunk, "results.jsonl")
    lines = read(log, "r").splitlines()
    for n, line in enumerate(lines, 1):
        rec = json.loads(line)
        if rec["id"] == rid:
            rec["path"] = path
            lines[n - 1] = json.dumps(rec)
            write(log, "\n".join(lines) + "\n")
            return n
    raise SystemExit(f"no record {rid} in {log}")


def tree(folder):
    """{relative path: bytes or link target} of everything under `folder` (None when it does not exist)."""
    if not os.path.lexists(folder):
        return None
    got = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = os.path.join(root, name)
            rel = os.path.relpath(p, folder)
            if os.path.islink(p):
                got[rel] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                got[rel] = read(p)
            else:
                got[rel] = "dir"
    return got


def refused(label, rc, log, *want):
    missing = [w for w in want if w not in log]
    return H.check(rc == 3 and not missing, f"{label}: exit {rc} (want 3)"
                   + (f", message lacks {missing}:\n{log[-1500:]}" if missing else ""))


def flip_idat_byte(path):
    """Flips one byte inside the first IDAT chunk's data (its CRC then no longer matches)."""
    data = bytearray(read(path))
    pos = 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT" and length > 2:
            data[pos + 8 + length // 2] ^= 0x55
            write(path, bytes(data), "wb")
            return
        pos += 12 + length
    raise SystemExit(f"no IDAT in {path}")


def png_crcs_ok(path):
    data = read(path)
    pos = 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        if zlib.crc32(data[pos + 4:pos + 8 + length]) != crc:
            return False
        if kind == b"IEND":
            return True
        pos += 12 + length
    return False


# ---- merge-results ---------------------------------------------------------------------------------

def case_path_escape(work):
    c = chunks(work)
    os.makedirs(os.path.join(work, "victim"))
    victim = write(os.path.join(work, "victim", "x"), "precious")
    out = os.path.join(work, "a", "b", "merged")
    beside = os.path.join(work, "a", "victim", "x")  # where out / "../../victim/x" lands
    os.makedirs(os.path.dirname(beside))
    write(beside, "keep me")
    line = set_path(c[0], "p0", "../../victim/x")
    rc, log = merge(out, c[0], c[1])
    refused("record path ../../victim/x", rc, log, os.path.join(c[0], "results.jsonl") + f":{line}", "p0",
            "../../victim/x")
    H.check(read(victim) == b"precious" and read(beside) == b"keep me" and os.stat(beside).st_nlink == 1,
            "the victim file and the file outside --out are untouched")
    H.check(not os.path.exists(out), "--out was not created")


def case_path_absolute(work):
    c = chunks(work)
    os.makedirs(os.path.join(work, "victim"))
    victim = write(os.path.join(work, "victim", "x.png"), "precious")
    line = set_path(c[1], "p1", victim)
    out = os.path.join(work, "merged")
    rc, log = merge(out, c[0], c[1])
    refused("absolute record path", rc, log, os.path.join(c[1], "results.jsonl") + f":{line}", "p1", victim)
    H.check(read(victim) == b"precious" and os.stat(victim).st_nlink == 1, "the victim file is untouched")
    H.check(not os.path.exists(out), "--out was not created")


def case_path_symlink(work):
    c = chunks(work)
    outside = os.path.join(work, "secret.png")
    shutil.copy(os.path.join(c[1], "images", "p1.png"), outside)  # a whole PNG, just not the chunk's
    img = os.path.join(c[0], "images", "p0.png")
    os.remove(img)
    os.symlink(outside, img)
    out = os.path.join(work, "merged")
    rc, log = merge(out, c[0], c[1])
    refused("images/p0.png a symlink leaving the chunk", rc, log, img)
    H.check(not os.path.exists(out), "--out was not created")
    # Resume does not trust it either: p0 runs again, into a file of its own (the outside file untouched).
    before = read(outside)
    manifest, _ = job(work)
    log = run(manifest, "--shard", "0/2")
    H.check("request p0: recorded done" in log and not os.path.islink(img) and read(outside) == before,
            "resume: the symlinked image runs again, written as a file of the chunk" +
            ("" if "request p0: recorded done" in log else f"\n{log[-1500:]}"))


def case_out_is_chunk(work):
    c = chunks(work)
    before = read(os.path.join(c[0], "results.jsonl"))
    rc, log = merge(c[0], c[0], c[1])
    refused("--out equal to a chunk", rc, log, "--out", c[0])
    rc, log = merge(os.path.join(c[0], "merged"), c[0], c[1])
    refused("--out inside a chunk", rc, log, "--out", os.path.join(c[0], "merged"))
    H.check(read(os.path.join(c[0], "results.jsonl")) == before and not os.path.exists(os.path.join(c[0], "merged")),
            "the chunk's log is byte for byte as it was, nothing created inside it")
    rc, log = merge(c[0], c[1])  # a chunk's folder as --out of other chunks: it would lose its own log
    refused("--out a chunk folder not named as input", rc, log, "--out", c[0], "results.jsonl")
    H.check(read(os.path.join(c[0], "results.jsonl")) == before, "the chunk's log is still as it was")
    # The run's output.dir holds the chunks: merging into it is the ordinary use.
    parent = os.path.dirname(c[0])
    rc, log = merge(parent, c[0], c[1])
    H.check(rc == 0 and sorted(r["id"] for r in results(parent)) == ["p0", "p1", "p2", "p3"]
            and read(os.path.join(c[0], "results.jsonl")) == before,
            f"--out holding the chunks: merged, the chunks as they were (exit {rc})" + ("" if rc == 0 else log[-1500:]))


def case_chunk_running(work):
    c = chunks(work)
    lock = os.path.join(c[1], ".tprun.lock")
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
    out = os.path.join(work, "merged")
    try:
        rc, log = merge(out, c[0], c[1])
    finally:
        os.close(fd)
    refused("a chunk locked by a running job", rc, log, c[1], f"in use by pid {os.getpid()}")
    H.check(not os.path.exists(out), "--out was not created")
    rc, log = merge(out, c[0], c[1])
    H.check(rc == 0, f"the lock released: merged (exit {rc})" + ("" if rc == 0 else log[-1500:]))
    H.check(not os.path.exists(os.path.join(c[0], ".tprun.lock")) or os.path.getsize(
        os.path.join(c[0], ".tprun.lock")) > 0, "the chunk's lock file is not emptied by the reader")


def case_bad_image(work):
    c = chunks(work)
    img = os.path.join(c[1], "images", "p3.png")
    good = read(img)
    write(img, good[:len(good) // 2], "wb")
    out = os.path.join(work, "merged")
    rc, log = merge(out, c[0], c[1])
    refused("a truncated PNG", rc, log, img)
    write(img, good, "wb")
    flip_idat_byte(img)
    rc, log = merge(out, c[0], c[1])
    refused("a PNG with a bad IDAT CRC", rc, log, img, "CRC")
    H.check(not os.path.exists(out), "--out was not created")


def case_atomic(work):
    c = chunks(work)
    old = os.path.join(work, "old")
    rc, log = merge(old, c[0], c[1])
    H.check(rc == 0, f"a first merge (exit {rc})" + ("" if rc == 0 else log[-1500:]))
    # An existing --out (that earlier merge, one image since replaced by hand) and one that does not exist yet.
    os.remove(os.path.join(old, "images", "p0.png"))  # a hard link of the chunk's image: unlinked, not written through
    write(os.path.join(old, "images", "p0.png"), "an earlier p0")
    before = tree(old)
    before.pop(".tprun.lock", None)  # who last held the lock (its content is informative only)
    os.remove(os.path.join(c[1], "images", "p3.png"))  # p0, p1, p2 would be placed first (id order)
    for out, was in ((os.path.join(work, "new"), None), (old, before)):
        rc, log = merge(out, c[0], c[1])
        refused(f"a missing image, --out {os.path.basename(out)}", rc, log, os.path.join(c[1], "images", "p3.png"))
        now = tree(out)
        if now is not None:
            now.pop(".tprun.lock", None)
        H.check(now == was, f"--out {os.path.basename(out)} is as it was: "
                + ("not created" if was is None else "same files, same bytes")
                + ("" if now == was else f"; now {sorted(now or {})}"))


def case_missing_array_chunk(work):
    c = chunks(work, n=3, n_requests=6, only=[0, 2])
    out = os.path.join(work, "merged")
    rc, log = merge(out, c[0], c[2])
    refused("shard 1 of 3 missing", rc, log, "shard-1-of-3", "--partial")
    H.check(not os.path.exists(out), "--out was not created")
    rc, log = merge(out, c[0], c[2], extra=("--partial",))
    H.check(rc == 0 and "shard-1-of-3" in log and sorted(r["id"] for r in results(out)) == ["p0", "p2", "p3", "p5"],
            f"--partial: merged with a warning naming shard-1-of-3 (exit {rc})" + ("" if rc == 0 else log[-1500:]))


def case_out_foreign_files(work):
    c = chunks(work)
    out = os.path.join(work, "merged")
    os.makedirs(os.path.join(out, "images"))
    mine = os.path.join(out, "images", "p0.png")
    Image.new("RGB", (8, 8), (1, 2, 3)).save(mine)
    before = read(mine)
    rc, log = merge(out, c[0], c[1])
    refused("a user's PNG at a merged image's place", rc, log, mine, "not a PNG tprun wrote", "move it away")
    H.check(read(mine) == before and sorted(os.listdir(os.path.join(out, "images"))) == ["p0.png"]
            and not os.path.exists(os.path.join(out, "results.jsonl")), "the user's PNG and --out unchanged")
    os.remove(mine)
    user_log = write(os.path.join(out, "results.jsonl"), "my own log\n")
    write(os.path.join(out, ".tprun-merged"), "")
    rc, log = merge(out, c[0], c[1])
    refused("a user's results.jsonl next to an empty .tprun-merged", rc, log, "results.jsonl that merge-results did "
            "not write")
    H.check(read(user_log) == b"my own log\n", "the user's results.jsonl unchanged")
    os.remove(user_log)
    os.remove(os.path.join(out, ".tprun-merged"))
    for attempt in ("first", "second"):
        rc, log = merge(out, c[0], c[1])
        H.check(rc == 0 and sorted(r["id"] for r in results(out)) == ["p0", "p1", "p2", "p3"],
                f"the {attempt} merge into its own --out (exit {rc})" + ("" if rc == 0 else log[-1500:]))
    # A chunk rerun since (a new p0.png, tprun's): the next merge replaces the merged copy.
    os.remove(os.path.join(c[0], "images", "p0.png"))
    manifest, _ = job(work)
    run(manifest, "--shard", "0/2")
    rc, log = merge(out, c[0], c[1])
    H.check(rc == 0 and os.path.samefile(os.path.join(out, "images", "p0.png"), os.path.join(c[0], "images", "p0.png")),
            f"a rerun chunk's new p0.png replaces the merged one (exit {rc})" + ("" if rc == 0 else log[-1500:]))


def case_out_nested_symlink(work):
    c = chunks(work)
    sub = os.path.join(c[0], "images", "sub")
    os.makedirs(sub)
    os.rename(os.path.join(c[0], "images", "p0.png"), os.path.join(sub, "p0.png"))
    set_path(c[0], "p0", "images/sub/p0.png")
    victim = os.path.join(work, "victim")
    os.makedirs(victim)
    out = os.path.join(work, "merged")
    os.makedirs(os.path.join(out, "images"))
    link = os.path.join(out, "images", "sub")
    os.symlink(victim, link)
    rc, log = merge(out, c[0], c[1])
    refused("images/sub in --out a symlink", rc, log, link, "symbolic link")
    H.check(os.listdir(victim) == [], "nothing written into the symlink's target")


# ---- resume ----------------------------------------------------------------------------------------

def finished(work, n_requests=4):
    manifest, out = job(work, n_requests)
    run(manifest)
    return manifest, out, os.path.join(out, "results.jsonl")


def case_resume_duplicate_done(work):
    manifest, out, log_path = finished(work)
    lines = read(log_path, "r").splitlines(keepends=True)
    first = next(n for n, l in enumerate(lines, 1) if json.loads(l)["id"] == "p1")
    text = "".join(lines) + lines[first - 1]
    write(log_path, text)
    rc, log = H.run(["run", manifest, "--progress", "none"], np_=1)
    refused("an id done twice", rc, log, f"{log_path}:{len(lines) + 1}", "p1", f"line {first}")
    H.check(read(log_path, "r") == text, "the log is as it was")


def case_resume_foreign_path(work):
    manifest, out, log_path = finished(work)
    os.makedirs(os.path.join(work, "elsewhere"))
    shutil.copy(os.path.join(out, "images", "p2.png"), os.path.join(work, "elsewhere", "p2.png"))
    for bad in ("../elsewhere/p2.png", os.path.join(work, "elsewhere", "p2.png"), "images//p2.png"):
        line = set_path(out, "p2", bad)
        text = read(log_path)
        rc, log = H.run(["run", manifest, "--progress", "none"], np_=1)
        refused(f"a done record with path '{bad}'", rc, log, f"{log_path}:{line}", "p2")
        H.check(read(log_path) == text, "the log is as it was")


def case_resume_bad_crc(work):
    manifest, out, _ = finished(work)
    img = os.path.join(out, "images", "p0.png")
    want = np.asarray(Image.open(img).convert("RGB"))
    flip_idat_byte(img)
    log = run(manifest)
    H.check("request p0: recorded done" in log and "CRC" in log, "p0 runs again, the log names the CRC"
            + ("" if "CRC" in log else f"\n{log[-1500:]}"))
    H.check(png_crcs_ok(img) and np.array_equal(np.asarray(Image.open(img).convert("RGB")), want),
            "p0.png is whole again, the same pixels")


def case_last_line_without_newline(work):
    manifest, out, log_path = finished(work)
    text = read(log_path)
    # The user's own spacing and a blank line stay as they are; only the last newline is missing.
    lines = text.decode().splitlines()
    lines[0] = json.dumps(json.loads(lines[0]), indent=None, separators=(" , ", " : "))
    edited = ("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:])).encode()
    write(log_path, edited, "wb")
    inode = os.stat(log_path).st_ino
    manifest5, _ = job(work, n_requests=5, name="job5")
    log = run(manifest5)
    H.check("4 already finished, 1 to run" in log and "dropped its last line" not in log,
            "the complete last record is kept: only p4 runs" + ("" if "1 to run" in log else f"\n{log[-1500:]}"))
    after = read(log_path)
    H.check(after.startswith(edited + b"\n") and after.count(b"\n") == edited.count(b"\n") + 2
            and json.loads(after[len(edited) + 1:].decode())["id"] == "p4",
            f"the user's lines byte for byte, a newline, then p4's record:\n{after.decode()[-600:]}")
    H.check(os.stat(log_path).st_ino == inode, "the log was appended to, not rewritten")
    # Nothing left to run: the log does not change at all.
    run(manifest5)
    H.check(read(log_path) == after, "a rerun with nothing to do leaves the log as it is")


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {
        "path_escape": case_path_escape, "path_absolute": case_path_absolute, "path_symlink": case_path_symlink,
        "out_is_chunk": case_out_is_chunk, "chunk_running": case_chunk_running, "bad_image": case_bad_image,
        "atomic": case_atomic, "missing_array_chunk": case_missing_array_chunk,
        "out_foreign_files": case_out_foreign_files, "out_nested_symlink": case_out_nested_symlink,
        "resume_duplicate_done": case_resume_duplicate_done, "resume_foreign_path": case_resume_foreign_path,
        "resume_bad_crc": case_resume_bad_crc, "last_line_without_newline": case_last_line_without_newline,
    }, "hostile-merge")


if __name__ == "__main__":
    sys.exit(main())
