#!/usr/bin/env python3
"""Hostile input, the embedding cache of staged jobs (<out>/embeddings/<fingerprint>/): a chunk is
trusted only when proven, an unusable one is moved aside (never deleted, never replaced) and its texts
encoded again with one warning naming it, so a rerun never wedges; the cache folders are never followed
through a symlink; `generate --inputs` refuses prompt embeddings of no text tokens.

Each case runs a tiny FLUX.1 staged job once (the reference images), copies its cache into fresh output
folders, damages it one way, reruns, and wants exit 0, the reference images bit for bit, the damaged file
moved to <name>.bad-1 next to it, and one warning naming it.

usage: hostile_cache.py TPRUN MPIRUN CASE
CASE: swapped_keys | relabelled_dtype | same_keys_file | zero_tokens | missing_tensor | corrupt_chunk |
      ranks_agree | symlinked_folders | generate_zero_tokens
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, jsonl, prompt_rows, read, results, run_cases, write, write_manifest  # noqa: E402

TPRUN, MPIRUN, CASE = sys.argv[1:4]
H = Harness(TPRUN, MPIRUN)
ROWS = prompt_rows(2)


def fail(msg):
    raise SystemExit("FAIL: " + msg)


# ---- safetensors without torch -----------------------------------------------------------------------

def st_load(path):
    """(metadata, {name: [dtype, shape, bytes]}) of a safetensors file."""
    b = read(path)
    n = int.from_bytes(b[:8], "little")
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    data = b[8 + n:]
    return meta, {k: [v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in h.items()}


def st_save(path, meta, tensors):
    h, blobs, off = {"__metadata__": meta}, [], 0
    for k in sorted(tensors):
        dtype, shape, raw = tensors[k]
        h[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    js = json.dumps(h).encode()
    write(path, len(js).to_bytes(8, "little") + js + b"".join(blobs), "wb")


# ---- the job -----------------------------------------------------------------------------------------

def job(work, model, name, tp=1, dp=0):
    out = os.path.join(work, name)
    m = write_manifest(os.path.join(work, name + ".toml"), model, jsonl(os.path.join(work, "rows.jsonl"), ROWS),
                       out, parallel={"tp": tp, "dp": dp}, tail='[schedule]\nphases = "staged"\n')
    return m, out


def run(manifest, np_=1):
    return H.run(["run", manifest, "--progress", "none"], np_=np_, timeout=300)


def images(out):
    d = os.path.join(out, "images")
    if not os.path.isdir(d):
        return {}
    return {f: read(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".png")}


def reference(work, np_=1, **par):
    """The model, the reference run's output folder and its chunk files ({name: path})."""
    model = H.init_model(work, "flux")
    m, out = job(work, model, "ref", **par)
    rc, log = run(m, np_)
    if rc != 0:
        fail(f"the reference run: exit {rc}\n{log[-3000:]}")
    return model, out


def cache_folder(out):
    root = os.path.join(out, "embeddings")
    (fp,) = os.listdir(root)
    return os.path.join(root, fp)


def chunks(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))


def fresh(work, model, ref_out, name, **par):
    """A new output folder holding a copy of the reference cache; (manifest, out, its cache folder)."""
    m, out = job(work, model, name, **par)
    os.makedirs(out)
    shutil.copytree(os.path.join(ref_out, "embeddings"), os.path.join(out, "embeddings"), symlinks=True)
    return m, out, cache_folder(out)


def rerun_recovers(label, m, out, bad_names, ref_images, np_=1):
    """The rerun exits 0 with the reference images, each damaged chunk moved to <name>.bad-1 and named in
    one warning; the next rerun exits 0 and moves nothing (never wedged)."""
    folder = cache_folder(out)
    rc, log = run(m, np_)
    got = images(out)
    H.check(rc == 0, f"{label}: exit {rc} (want 0)" + ("" if rc == 0 else "\n" + log[-2500:]))
    H.check(got == ref_images, f"{label}: the reference images bit for bit"
            + ("" if got == ref_images else f" ({sorted(k for k in ref_images if got.get(k) != ref_images[k])} "
                                            "differ or are missing)"))
    for bad_name in bad_names:
        path = os.path.join(folder, bad_name)
        moved = os.path.lexists(path + ".bad-1")  # (its texts encoded again may take the same name)
        H.check(moved, f"{label}: {bad_name} moved aside to {bad_name}.bad-1 ({sorted(os.listdir(folder))})")
        warned = log.count(path + " cannot be used")  # (a key's text may hold a newline)
        H.check(warned == 1 and "moved it aside" in log, f"{label}: one warning naming {path} ({warned})"
                + ("" if warned == 1 else "\n" + log[-3000:]))
    rc, log2 = run(m, np_)
    again = [f for f in os.listdir(folder) if f.endswith(".bad-2")]
    H.check(rc == 0 and not again, f"{label}: the next rerun exits {rc}, moves nothing ({again})")
    return log


def damaged_rerun(work, label, damage):
    """Reference run, a copy of its cache damaged by damage(folder, chunk path) -> the names it damaged,
    rerun."""
    model, ref_out = reference(work)
    ref_images = images(ref_out)
    m, out, folder = fresh(work, model, ref_out, "damaged")
    (chunk,) = chunks(folder)
    bad = damage(folder, os.path.join(folder, chunk)) or [chunk]
    return rerun_recovers(label, m, out, bad, ref_images)


def swapped_keys(work):
    def damage(folder, path):
        meta, t = st_load(path)
        keys = json.loads(meta["keys"])
        keys[0], keys[1] = keys[1], keys[0]
        meta["keys"] = json.dumps(keys)
        st_save(path, meta, t)
    damaged_rerun(work, "two keys swapped in the chunk's metadata", damage)


def relabelled_dtype(work):
    def damage(folder, path):
        meta, t = st_load(path)
        for name in t:
            if name.endswith("/prompt_embeds"):
                t[name][0] = "I32"  # F32 -> I32: the same bytes read as integers
        st_save(path, meta, t)
    damaged_rerun(work, "prompt_embeds relabelled F32 -> I32", damage)


def same_keys_file(work):
    """A file with the same marker, fingerprint and keys and zeroed tensors that sorts first (the original
    used it): its hashes fail, it is moved aside, the real chunk is used. A byte-identical copy under
    another name (hashes pass): a key in two files trusts neither, both moved aside, the texts encoded
    again."""
    model, ref_out = reference(work)
    ref_images = images(ref_out)
    m, out, folder = fresh(work, model, ref_out, "zeroed")
    (chunk,) = chunks(folder)
    meta, t = st_load(os.path.join(folder, chunk))
    for v in t.values():
        v[2] = bytes(len(v[2]))
    st_save(os.path.join(folder, "0-zeroed.safetensors"), meta, t)
    log = rerun_recovers("a zeroed copy with the same keys", m, out, ["0-zeroed.safetensors"], ref_images)
    H.check(not os.path.exists(os.path.join(folder, chunk + ".bad-1")) and "0 run, 2 saved" in log,
            "a zeroed copy with the same keys: the real chunk kept and used")
    m, out, folder = fresh(work, model, ref_out, "copied")
    shutil.copy(os.path.join(folder, chunk), os.path.join(folder, "0-copy.safetensors"))
    log = rerun_recovers("a byte-identical copy", m, out, ["0-copy.safetensors", chunk], ref_images)
    H.check("is in both" in log and "2 run, 0 saved" in log, "a byte-identical copy: neither trusted, both encoded")


def zero_tokens(work):
    def damage(folder, path):
        meta, t = st_load(path)
        for name, v in t.items():
            if name.startswith("0/") and name.endswith("/prompt_embeds"):
                v[1] = [1, 0, v[1][2]]
                v[2] = b""
        st_save(path, meta, t)
    damaged_rerun(work, "a [1, 0, D] prompt_embeds", damage)


def missing_tensor(work):
    def damage(folder, path):
        meta, t = st_load(path)
        st_save(path, meta, {k: v for k, v in t.items() if not k.endswith("/prompt_embeds")})
    damaged_rerun(work, "a chunk without prompt_embeds", damage)


def corrupt_chunk(work):
    """Truncated, empty, symlinked, folder, FIFO, bad header: each moved aside and re-encoded (the original
    wrote the same deterministic name and failed with exit 7 on every rerun)."""
    model, ref_out = reference(work)
    ref_images = images(ref_out)
    outside = os.path.join(work, "outside.safetensors")
    (chunk,) = chunks(cache_folder(ref_out))
    shutil.copy(os.path.join(cache_folder(ref_out), chunk), outside)
    outside_bytes = read(outside)

    def truncated(p):
        os.truncate(p, os.path.getsize(p) - 7)

    def empty(p):
        os.truncate(p, 0)

    def symlink(p):
        os.remove(p)
        os.symlink(outside, p)

    def folder(p):
        os.remove(p)
        os.mkdir(p)

    def fifo(p):
        os.remove(p)
        os.mkfifo(p)

    def header(p):
        b = bytearray(read(p))
        b[8:10] = b"[["  # the header's JSON broken
        write(p, bytes(b), "wb")

    for kind, damage in [("truncated", truncated), ("empty", empty), ("symlink", symlink), ("folder", folder),
                         ("FIFO", fifo), ("bad header", header)]:
        m, out, f = fresh(work, model, ref_out, "c_" + kind.replace(" ", "_"))
        damage(os.path.join(f, chunk))
        rerun_recovers(f"a {kind} chunk", m, out, [chunk], ref_images)
    H.check(read(outside) == outside_bytes, "the symlink's target was never written")


def ranks_agree(work):
    """tp 2 (both ranks read the cache, one moves the file, both re-encode together, no hang) and dp 2
    (two replicas, one mover: only <name>.bad-1, no .bad-2)."""
    for what, par in [("tp 2", dict(tp=2)), ("dp 2", dict(tp=1, dp=2))]:
        sub = os.path.join(work, what.replace(" ", ""))
        os.makedirs(sub)
        model, ref_out = reference(sub, np_=2, **par)
        ref_images = images(ref_out)
        m, out, folder = fresh(sub, model, ref_out, "damaged", **par)
        for c in chunks(folder):
            os.truncate(os.path.join(folder, c), 0)
        names = chunks(folder)
        rc, log = run(m, np_=2)
        got = images(out)
        H.check(rc == 0 and got == ref_images, f"{what}: exit {rc}, the reference images"
                + ("" if rc == 0 else "\n" + log[-2500:]))
        for c in names:
            p = os.path.join(folder, c)
            H.check(os.path.exists(p + ".bad-1") and not os.path.exists(p + ".bad-2"),
                    f"{what}: {c} moved aside once ({sorted(os.listdir(folder))})")
            n = log.count(p + " cannot be used")
            H.check(n == 1, f"{what}: one warning for {c} ({n})")


def symlinked_folders(work):
    """embeddings/ or its fingerprint folder as a symlink to a folder outside: exit 3 naming it, on every
    rank, nothing written outside."""
    model, ref_out = reference(work)
    fp = os.path.basename(cache_folder(ref_out))
    for what in ["embeddings", "fingerprint"]:
        outside = os.path.join(work, "outside-" + what)
        os.makedirs(os.path.join(outside, fp))
        m, out = job(work, model, "s_" + what)
        os.makedirs(os.path.join(out, "embeddings") if what == "fingerprint" else out)
        link = os.path.join(out, "embeddings") if what == "embeddings" else os.path.join(out, "embeddings", fp)
        os.symlink(outside if what == "embeddings" else os.path.join(outside, fp), link)
        H.expect_config_error(f"{what} folder as a symlink", ["run", m, "--progress", "none"], link, np_=2)
        written = [os.path.join(r, f) for r, _, fs in os.walk(outside) for f in fs]
        H.check(written == [], f"{what} folder as a symlink: nothing written outside ({written})")


def generate_zero_tokens(work):
    """generate --inputs with prompt_embeds of 0 text tokens (or integer prompt_embeds): a ConfigError
    naming the --inputs file and the tensor, before any weight is loaded."""
    model = H.init_model(work, "flux")
    cfg = json.load(open(os.path.join(model, "transformer", "config.json")))
    d, pooled = cfg["joint_attention_dim"], cfg["pooled_projection_dim"]
    for what, embeds in [("0 text tokens", ["F32", [1, 0, d], b""]),
                         ("integer prompt_embeds", ["I32", [1, 4, d], bytes(4 * 4 * d)])]:
        inputs = os.path.join(work, what.replace(" ", "_") + ".safetensors")
        st_save(inputs, {}, {"prompt_embeds": embeds, "pooled_prompt_embeds": ["F32", [1, pooled], bytes(4 * pooled)]})
        out = os.path.join(work, what.replace(" ", "_") + ".png")
        args = ["generate", "--model", model, "--inputs", inputs, "--out", out, "--height", "32", "--width", "32",
                "--steps", "1"]
        H.expect_config_error(f"generate --inputs with {what}", args, f"--inputs {inputs}: tensor 'prompt_embeds'",
                              np_=1, absent="loaded ")
        H.check(not os.path.exists(out), f"generate --inputs with {what}: no image")


CASES = {"swapped_keys": swapped_keys, "relabelled_dtype": relabelled_dtype, "same_keys_file": same_keys_file,
         "zero_tokens": zero_tokens, "missing_tensor": missing_tensor, "corrupt_chunk": corrupt_chunk,
         "ranks_agree": ranks_agree, "symlinked_folders": symlinked_folders,
         "generate_zero_tokens": generate_zero_tokens}

if __name__ == "__main__":
    sys.exit(run_cases(H, CASES, "hostile-cache"))
