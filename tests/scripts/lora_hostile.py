#!/usr/bin/env python3
"""Hostile LoRA adapters given to `tprun generate --lora` (issue 34, "Bad input"), on a tiny FLUX.1
pipeline (`init-model --arch flux`: 2 heads, so tp 1 and tp 2), each refusal at tp 2 (mpirun -np 2:
the case where an error must reach every rank at once; the checks before the adapter's values do not
depend on the TP size), the non-finite values at tp 1 and tp 2 (each rank reads its own slice), the runs
at both. A refused case must end with ONE error line on every rank, the same text on each,
naming the file and the key (or the option / field), with the exit code of the error's kind (README
"Exit codes": 3 configuration, 4 checkpoint), without an MPI_Abort (a clean, identical error
everywhere), before any compute (no "step 1/" line), within a hang timeout; the model folder and every
adapter file keep their bytes (hashed before and after) and the --out folder stays empty.

Cases (one ctest entry each; `lora_hostile.py TPRUN MPIRUN CASE`):
  files    the file and the command line: a truncated adapter; malformed headers (bad JSON, offsets past
           the end, a header length of 2^63); not a safetensors file; an empty file; --lora naming a
           folder, a fifo, a missing file; --out naming the adapter; --lora-scale nan / inf / 1e9; more
           --lora-scale than --lora; --lora-apply bogus. A good adapter runs (the control).
  tensors  what the file holds: keys of another family (Wan, Qwen-Image); unknown keys with
           --lora-strict true (refused naming the first key) and false (a warning naming it, runs); a
           rank larger than the layer; lora_A too narrow / too wide, lora_B rows wrong (key and both
           shapes named); a down without its up; a module adapted twice; 1-D and int tensors; an alpha
           that is NaN / negative / not a scalar; lora_adapter_metadata that is not JSON; NaN / Inf
           weights, among them a NaN only in the rows of transformer_blocks.0.attn.to_q's lora_B that
           tp rank 1 reads and an Inf only in the columns of to_out.0's lora_A that rank 1 reads (every
           rank must still fail naming the key: the all-reduce of lora_slices.cpp); --lora-apply fused
           with fp8 layerwise casting refused, and auto then applying at run time.
"""
import hashlib
import json
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, run_cases  # noqa: E402

H = None
ERROR_LINE = re.compile(r"\[r(\d+)/(\d+)\] \[error\] (.*)$")
CRASH_WORDS = ("MPI_ABORT", "Segmentation fault", "core dumped", "Aborted", "terminate called", "signal 6",
               "signal 11")
# The tiny FLUX.1 transformer's Linear shapes (out, in) the cases adapt.
SHAPES = {"transformer_blocks.0.attn.to_q": (32, 32), "transformer_blocks.0.attn.to_out.0": (32, 32),
          "transformer_blocks.0.ff.net.0.proj": (128, 32)}
FP8 = 'layerwise_casting={storage="float8_e4m3fn"}'


class Work:
    """The case's model folder, adapter files and generate runs."""

    def __init__(self, work):
        self.work = work
        self.model = H.init_model(work, "flux", "model")
        self.inputs = []  # every adapter file made: hashed around each run
        self.runs = 0

    def path(self, name):
        return os.path.join(self.work, name)

    def raw(self, name, data):
        """A file of exactly these bytes."""
        p = self.path(name)
        with open(p, "wb") as f:
            f.write(data)
        self.inputs.append(p)
        return p

    def adapter(self, name, tensors, metadata=None):
        """A safetensors file of `tensors` (name -> torch tensor) and header `metadata`."""
        from safetensors.torch import save_file
        p = self.path(name)
        save_file({k: v.contiguous() for k, v in tensors.items()}, p, metadata=metadata)
        self.inputs.append(p)
        return p

    def digest(self):
        """sha256 of every file of the model folder and of every adapter file, by path."""
        files = [os.path.join(d, f) for d, _, fs in os.walk(self.model) for f in fs] + self.inputs
        out = {}
        for p in sorted(files):
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[p] = "not a regular file"
        return out

    def generate(self, np_, lora_args, out=None):
        """(exit code, log, out folder listing) of a 64x64, 2-step generate at tp np_ with `lora_args`;
        --out is a file in a fresh empty folder unless `out` names one."""
        self.runs += 1
        folder = self.path(f"out{self.runs}")
        os.makedirs(folder)
        args = ["generate", "--model", self.model, "--prompt", "a red fox", "--height", "64", "--width", "64",
                "--steps", "2", "--seed", "3", "--out", out or os.path.join(folder, "x.png"), *lora_args]
        rc, log = H.run(args, np_=np_, timeout=180)
        return rc, log, sorted(os.listdir(folder))


def error_lines(log):
    """rank -> the messages of its [error] lines."""
    by_rank = {}
    for line in log.splitlines():
        m = ERROR_LINE.search(line)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(3))
    return by_rank


def refused(w, label, lora_args, want, code, nps=(2,), out=None):
    """At each tp of `nps`: exit `code`, one error line on every rank, the same on each (and the same at
    every tp), holding every string of `want`; no abort, no step run, nothing written, the model and
    adapter files unchanged."""
    texts = {}
    for np_ in nps:
        before = w.digest()
        rc, log, listing = w.generate(np_, lora_args, out)
        after = w.digest()
        errors = error_lines(log)
        messages = {m for ms in errors.values() for m in ms}
        one_each = sorted(errors) == list(range(np_)) and all(len(ms) == 1 for ms in errors.values())
        same = len(messages) == 1
        text = next(iter(messages)) if same else ""
        missing = [s for s in want if s not in text]
        crash = [c for c in CRASH_WORDS if c in log]
        problems = []
        if rc != code:
            problems.append(f"exit {rc} (want {code})")
        if not one_each:
            problems.append(f"error lines by rank {dict((r, len(ms)) for r, ms in errors.items())} (want one on each "
                            f"of {np_})")
        if one_each and not same:
            problems.append("the ranks' messages differ")
        if same and missing:
            problems.append(f"the message lacks {missing}")
        if crash:
            problems.append(f"{crash} in the log")
        if "step 1/" in log:
            problems.append("a denoising step ran")
        if before != after:
            problems.append(f"files changed: {[p for p in before if before[p] != after.get(p)]}")
        if listing:
            problems.append(f"the --out folder holds {listing}")
        if same:
            texts[np_] = text
        if same and len(set(texts.values())) > 1:
            problems.append(f"the message differs between tp sizes: {texts}")
        what = f"tp {np_} {label}: " + ("; ".join(problems) if problems
                                        else f"exit {code}, on every rank: {text[:150]}")
        H.check(not problems, what + (f"\n{log[-1500:]}" if problems else ""))


def runs(w, label, lora_args, want_log=(), nps=(1, 2)):
    """At each tp of `nps`: exit 0, the image written, every string of `want_log` in the log, the model and
    adapter files unchanged."""
    for np_ in nps:
        before = w.digest()
        rc, log, listing = w.generate(np_, lora_args)
        missing = [s for s in want_log if s not in log]
        ok = rc == 0 and listing == ["x.png"] and not missing and w.digest() == before
        H.check(ok, f"tp {np_} {label}: exit {rc}, wrote {listing}" + (f", the log lacks {missing}" if missing else "")
                + ("" if ok else f"\n{log[-1500:]}"))


def pair(module, rank=4, seed=0, prefix="transformer.", down_shape=None, up_shape=None):
    """{prefix+module.lora_A.weight: [rank, in], ...lora_B.weight: [out, rank]} of small random values."""
    import torch
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = SHAPES[module]
    return {f"{prefix}{module}.lora_A.weight": 0.1 * torch.randn(*(down_shape or (rank, in_f)), generator=g),
            f"{prefix}{module}.lora_B.weight": 0.1 * torch.randn(*(up_shape or (out_f, rank)), generator=g)}


def header_file(w, name, header, data=b"", length=None):
    """A safetensors-like file: 8-byte little-endian header length (`length`, else the header's), the
    header's JSON bytes (or `header` as given when bytes), then `data`."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return w.raw(name, struct.pack("<Q", len(text) if length is None else length) + text + data)


def files(work):
    w = Work(work)
    good = w.adapter("good.safetensors", {**pair("transformer_blocks.0.attn.to_q"),
                                          **pair("transformer_blocks.0.ff.net.0.proj", seed=1)})
    runs(w, "a good adapter (the control)", ["--lora", good], ["adapters: 1 files"])

    data = open(good, "rb").read()
    cut = w.raw("truncated.safetensors", data[:len(data) - 700])
    refused(w, "a truncated adapter", ["--lora", cut], [cut, "truncated"], 4)
    bad_json = header_file(w, "bad_json.safetensors", b'{"transformer.x.lora_A.weight": {"dtype": "F32", ')
    refused(w, "a header that is not JSON", ["--lora", bad_json], [bad_json, "header"], 4)
    past = header_file(w, "past_end.safetensors",
                       {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight":
                        {"dtype": "F32", "shape": [4, 32], "data_offsets": [0, 512]},
                        "transformer.transformer_blocks.0.attn.to_q.lora_B.weight":
                        {"dtype": "F32", "shape": [32, 4], "data_offsets": [512, 1024]}}, b"\0" * 600)
    refused(w, "offsets past the end of the file", ["--lora", past],
            [past, "transformer.transformer_blocks.0.attn.to_q.lora_B.weight"], 4)
    huge = header_file(w, "huge_header.safetensors", {"__metadata__": {}}, length=2 ** 63)
    refused(w, "a header length of 2^63", ["--lora", huge], [huge, "header"], 4)
    text = w.raw("notes.safetensors", b"these are my favourite LoRA settings: rank 16, alpha 8\n" * 4)
    refused(w, "not a safetensors file", ["--lora", text], [text, "not a safetensors file"], 4)
    empty = w.raw("empty.safetensors", b"")
    refused(w, "an empty file", ["--lora", empty], [empty, "too short"], 4)

    folder = w.path("adapter_folder.safetensors")
    os.makedirs(folder)
    refused(w, "--lora naming a folder", ["--lora", folder], ["--lora", folder, "is a folder"], 3)
    fifo = w.path("adapter_fifo.safetensors")
    os.mkfifo(fifo)
    refused(w, "--lora naming a fifo (no hang)", ["--lora", fifo], ["--lora", fifo, "not a regular file (a pipe)"], 3)
    missing = w.path("missing.safetensors")
    refused(w, "--lora naming a missing file", ["--lora", missing], ["--lora", missing, "does not exist"], 3)
    notes = w.raw("notes.txt", b"rank 16\n")
    refused(w, "--lora naming a file that is not .safetensors", ["--lora", notes],
            ["--lora", notes, "does not end in .safetensors"], 3)
    w.inputs.append(good)
    refused(w, "--out naming the adapter file", ["--lora", good], ["--out", good], 3, out=good)

    for value in ("nan", "inf", "1e9"):
        refused(w, f"--lora-scale {value}", ["--lora", good, "--lora-scale", value], ["--lora-scale", good], 3)
    refused(w, "two --lora-scale for one --lora", ["--lora", good, "--lora-scale", "0.5", "--lora-scale", "0.7"],
            ["--lora-scale", "2 scales for 1"], 3)
    refused(w, "--lora-apply bogus", ["--lora", good, "--lora-apply", "bogus"], ["--lora-apply", "'bogus'"], 3)


def tensors(work):
    import torch
    w = Work(work)
    q, out0, ff = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_out.0",
                   "transformer_blocks.0.ff.net.0.proj")
    qa, qb = f"transformer.{q}.lora_A.weight", f"transformer.{q}.lora_B.weight"

    # Keys of other families: the file names no module of FLUX.1.
    wan = w.adapter("wan.safetensors", {
        "diffusion_model.blocks.0.self_attn.q.lora_A.weight": torch.zeros(4, 32),
        "diffusion_model.blocks.0.self_attn.q.lora_B.weight": torch.zeros(32, 4)})
    refused(w, "a Wan adapter", ["--lora", wan], [wan, "diffusion_model.blocks.0.self_attn.q.lora_A.weight",
                                                    "map to no module"], 4)
    qwen = w.adapter("qwen.safetensors", {
        "transformer.transformer_blocks.0.img_mlp.net.0.proj.lora_A.weight": torch.zeros(4, 32),
        "transformer.transformer_blocks.0.img_mlp.net.0.proj.lora_B.weight": torch.zeros(128, 4)})
    refused(w, "a Qwen-Image adapter", ["--lora", qwen],
            [qwen, "transformer.transformer_blocks.0.img_mlp.net.0.proj.lora_A.weight", "map to no module"], 4)
    unknown_key = "transformer.transformer_blocks.0.attn.to_gate.lora_A.weight"
    mixed = w.adapter("unknown_keys.safetensors", {**pair(q), unknown_key: torch.zeros(4, 32),
                                                   unknown_key.replace("lora_A", "lora_B"): torch.zeros(32, 4)})
    refused(w, "unknown keys, --lora-strict true", ["--lora", mixed], [mixed, unknown_key, "lora_strict"], 4)
    runs(w, "unknown keys, --lora-strict false (a warning, runs)", ["--lora", mixed, "--lora-strict", "false"],
         [f"[warning] adapter {mixed}: 2 keys left out", unknown_key])

    # Shapes.
    big = w.adapter("rank40.safetensors", pair(q, rank=40))
    refused(w, "a rank larger than the layer", ["--lora", big], [big, qa, "rank 40", "larger than the layer"], 4)
    narrow = w.adapter("narrow_a.safetensors", pair(q, down_shape=(4, 16)))
    refused(w, "lora_A too narrow", ["--lora", narrow], [narrow, qa, "[4, 16]", "32 inputs"], 4)
    wide = w.adapter("wide_a.safetensors", pair(q, down_shape=(4, 48)))
    refused(w, "lora_A too wide", ["--lora", wide], [wide, qa, "[4, 48]", "32 inputs"], 4)
    rows = w.adapter("b_rows.safetensors", pair(q, up_shape=(30, 4)))
    refused(w, "lora_B rows wrong", ["--lora", rows], [rows, qb, "[30, 4]", "32 output rows"], 4)
    down_only = w.adapter("down_only.safetensors", {qa: torch.zeros(4, 32), **pair(ff)})
    refused(w, "a down without its up", ["--lora", down_only], [down_only, q, "lora_B"], 4)
    twice = w.adapter("twice.safetensors", {**pair(q), **pair(q, seed=2, prefix="")})
    refused(w, "a module adapted twice", ["--lora", twice], [twice, q, "adapted twice"], 4)
    flat = w.adapter("one_d.safetensors", {qa: torch.zeros(32), qb: torch.zeros(32)})
    refused(w, "1-D tensors", ["--lora", flat], [flat, qa, "2-D"], 4)
    ints = w.adapter("int.safetensors", {qa: torch.zeros(4, 32, dtype=torch.int32), qb: torch.zeros(32, 4)})
    refused(w, "an int32 lora_A", ["--lora", ints], [ints, qa, "I32"], 4)

    # Alphas and metadata.
    alpha_key = f"transformer.{q}.alpha"
    for tag, alpha, want in (("nan", torch.tensor(float("nan")), "finite positive"),
                             ("negative", torch.tensor(-4.0), "finite positive"),
                             ("vector", torch.tensor([4.0, 4.0]), "one number")):
        f = w.adapter(f"alpha_{tag}.safetensors", {**pair(q), alpha_key: alpha})
        refused(w, f"an alpha that is {tag}", ["--lora", f], [f, alpha_key, want], 4)
    meta = w.adapter("metadata.safetensors", pair(q), metadata={"lora_adapter_metadata": "{r: 4, lora_alpha"})
    refused(w, "lora_adapter_metadata that is not JSON", ["--lora", meta], [meta, "lora_adapter_metadata"], 4)

    # Values: NaN / Inf, once only where tp rank 1 reads (to_q is colwise: rank 1 reads B's rows 16-31;
    # to_out.0 is rowwise: rank 1 reads A's columns 16-31).
    t = pair(q)
    t[qb][20, 1] = float("nan")
    nan_b = w.adapter("nan_rank1.safetensors", {**pair(ff), **t})
    refused(w, "a NaN only in tp rank 1's rows of lora_B", ["--lora", nan_b], [nan_b, qb, "NaN or infinite"], 4, nps=(1, 2))
    t = pair(out0)
    oa = f"transformer.{out0}.lora_A.weight"
    t[oa][2, 30] = float("inf")
    inf_a = w.adapter("inf_rank1.safetensors", t)
    refused(w, "an Inf only in tp rank 1's columns of lora_A", ["--lora", inf_a], [inf_a, oa, "NaN or infinite"], 4, nps=(1, 2))
    # Rank 0 finds a bad value in one module, rank 1 in another: both name the same first key.
    t = {**pair(q), **pair(out0, seed=3)}
    t[qb][3, 0] = float("nan")
    t[oa][0, 25] = float("-inf")
    both = w.adapter("nan_both.safetensors", t)
    refused(w, "NaNs in different modules on each rank", ["--lora", both], [both, "NaN or infinite"], 4, nps=(1, 2))

    # fused needs weights resident in the compute dtype: refused with fp8 storage; auto applies at run time.
    good = w.adapter("good.safetensors", pair(q))
    refused(w, "--lora-apply fused with fp8 layerwise casting",
            ["--lora", good, "--lora-apply", "fused", "--memory", FP8], ["fused", q, "not kept resident"], 3)
    runs(w, "--lora-apply auto with fp8 layerwise casting", ["--lora", good, "--memory", FP8],
         ["applied at run time", "not kept resident"])


CASES = {"files": files, "tensors": tensors}

if __name__ == "__main__":
    H = Harness(os.path.abspath(sys.argv[1]), sys.argv[2])
    sys.exit(run_cases(H, CASES, "tprun-lora-hostile"))
