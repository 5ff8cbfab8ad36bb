"""What the script tests share: running tprun under mpirun with a hang timeout, `init-model` folders,
job files (manifest, requests, results log), ok / FAIL lines counted into the script's exit status,
and the causal VAE parity scripts' model, `tprun forward` run and comparison (qwen_image_vae_parity.py,
wan_vae_parity.py). torch is imported only by the helpers that need it, so job scripts without torch
start fast."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# Prompts of the job tests (`p0`, `p1`, ... in this order).
PROMPTS = ["a red fox in the snow", "a lighthouse at dusk", "a bowl of fruit", "a city at night",
           "a small boat on a lake", "a mountain village", "a cat on a sofa", "an old library"]

# [defaults] of a job manifest: a tiny model's image in two steps, fast on two cores.
JOB_DEFAULTS = {"height": 32, "width": 32, "steps": 2, "max_sequence_length": 32, "seed": 5}


def write(path, text, mode="w"):
    """Writes `text` (bytes with mode "wb") to `path`; returns `path`."""
    with open(path, mode) as f:
        f.write(text)
    return path


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def jsonl(path, rows):
    """A requests file (or any JSON-lines file): one compact JSON object a line."""
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


def prompt_rows(n, texts=PROMPTS, prefix="p"):
    """[{"id": "p0", "prompt": texts[0]}, ...] for the first n texts."""
    return [{"id": f"{prefix}{i}", "prompt": t} for i, t in enumerate(texts[:n])]


def manifest_text(model, requests, out, parallel=None, defaults=None, tail=""):
    """A job manifest: model, requests, [parallel] when given (keys in order), [defaults] (JOB_DEFAULTS
    updated by `defaults`), [output] dir, then `tail` as is. Line numbers are stable: tests name them."""
    lines = [f'model = "{model}"', f'requests = "{requests}"']
    if parallel:
        lines += ["[parallel]", *(f"{k} = {v}" for k, v in parallel.items())]
    lines += ["[defaults]", *(f"{k} = {v}" for k, v in dict(JOB_DEFAULTS, **(defaults or {})).items())]
    lines += ["[output]", f'dir = "{out}"']
    return "\n".join(lines) + "\n" + tail


def write_manifest(path, model, requests, out, parallel=None, defaults=None, tail=""):
    return write(path, manifest_text(model, requests, out, parallel, defaults, tail))


def results(out):
    """The records of out/results.jsonl, in file order (blank lines skipped)."""
    return [json.loads(l) for l in read(os.path.join(out, "results.jsonl"), "r").splitlines() if l.strip()]


def tiny_flux(tprun, folder):
    """`tprun init-model FOLDER --arch flux --preset tiny` (the job tests' model); returns `folder`."""
    subprocess.run([tprun, "init-model", folder, "--arch", "flux", "--preset", "tiny"], check=True,
                   stdout=subprocess.DEVNULL)
    return folder


class Harness:
    def __init__(self, tprun, mpirun):
        self.tprun, self.mpirun, self.failures = tprun, mpirun, 0

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failures += 1
        return ok

    def run(self, args, np_=1, timeout=300):
        """(exit code, stdout + stderr) of `mpirun -np np_ tprun ARGS --log-dir ''`; None on a timeout."""
        cmd = [self.mpirun, "--oversubscribe", "-np", str(np_), self.tprun, *args, "--log-dir", ""]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, "timed out (hang?)"
        return r.returncode, r.stdout + r.stderr

    def expect_config_error(self, label, args, want, np_=2, absent=None):
        """`args` under mpirun -np np_ ends with exit 3 and `want` on every rank (and, when given, `absent`
        nowhere in the log: e.g. a line a weight load would print)."""
        rc, log = self.run(args, np_=np_, timeout=120)
        lines = [l for l in log.splitlines() if want in l]
        ok = rc == 3 and len(lines) >= np_ and (absent is None or absent not in log)
        return self.check(ok, f"{label}: exit {rc} (want 3), '{want}' on {len(lines)} of {np_} ranks"
                          + ("" if absent is None else f", no '{absent}'") + ("" if lines else f"\n{log[-800:]}"))

    def forward(self, work, folder, comp, inputs, tag, memory=(), np_=1, dtype=None):
        """(outputs, log) of `tprun forward --model FOLDER` on `inputs` (saved as work/TAG_in.safetensors;
        --component COMP, --dtype DTYPE and --tp NP_ where given, one --memory per entry); outputs None
        when it failed (reported)."""
        from safetensors.torch import load_file, save_file
        inp, out = os.path.join(work, f"{tag}_in.safetensors"), os.path.join(work, f"{tag}_out.safetensors")
        save_file({k: v.contiguous() for k, v in inputs.items()}, inp)
        args = ["forward", "--model", folder, "--inputs", inp, "--out", out]
        if dtype:
            args += ["--dtype", dtype]
        if comp:
            args += ["--component", comp]
        if np_ > 1:
            args += ["--tp", str(np_)]
        for m in memory:
            args += ["--memory", m]
        t0 = time.time()
        rc, log = self.run(args, np_=np_)
        if not self.check(rc == 0, f"{tag}: forward ran ({time.time() - t0:.1f} s)"
                          + ("" if rc == 0 else f": {log[-1500:]}")):
            return None, log
        return load_file(out), log

    def compare(self, tag, got, want, tol):
        """Checks `got` has diffusers' shape and is within `tol` of `want` (max abs diff, returned)."""
        same = tuple(got.shape) == tuple(want.shape)
        diff = (got.float() - want.float()).abs().max().item() if same else float("inf")
        self.check(diff <= tol, f"{tag}: shape {tuple(got.shape)} (diffusers {tuple(want.shape)}), "
                   f"max abs diff {diff:.3g} (tolerance {tol})")
        return diff

    def expect_config_refusals(self, work, folder, inputs_file, cases, comp="vae_decoder"):
        """For each (label, patch, want) of `cases`: a copy of the model FOLDER (its config.json with `patch`
        over it, its diffusion_pytorch_model.safetensors linked) given to `tprun forward --component COMP`
        at np 2 exits 4 with `want` and config.json on both ranks, writes nothing and loads no weight. The
        refusal comes from the config read, which runs after the checkpoint's headers and before its
        tables are validated or any tensor is read; "attention (" is logged after the weights load."""
        cfg = json.load(open(os.path.join(folder, "config.json")))
        weights = os.path.join(folder, "diffusion_pytorch_model.safetensors")
        for i, (label, patch, want) in enumerate(cases):
            d = os.path.join(work, f"bad{i}")
            os.makedirs(d)
            json.dump(dict(cfg, **patch), open(os.path.join(d, "config.json"), "w"))
            os.symlink(weights, os.path.join(d, "diffusion_pytorch_model.safetensors"))
            out = os.path.join(work, f"bad{i}_out.safetensors")
            rc, log = self.run(["forward", "--model", d, "--component", comp, "--inputs", inputs_file, "--out", out],
                               np_=2, timeout=120)
            lines = [l for l in log.splitlines() if want in l and "config.json" in l]
            self.check(rc == 4 and len(lines) >= 2 and not os.path.exists(out) and "attention (" not in log,
                       f"{label}: exit {rc} (want 4), '{want}' with the file named on {len(lines)} of 2 ranks, "
                       "no weight load" + ("" if lines else f"\n{log[-600:]}"))

    def init_model(self, work, arch, name=None):
        d = os.path.join(work, name or arch)
        r = subprocess.run([self.tprun, "init-model", d, "--arch", arch], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"init-model {arch} failed: {r.stderr}")
        return d


def save_causal_vae(vae, seed, folder):
    """Redraws every parameter of a diffusers causal VAE (AutoencoderKLQwenImage / AutoencoderKLWan) from a
    generator seeded with `seed` (RMS gammas ~ N(1, 0.1), biases ~ N(0, 0.05^2), weights ~ N(0, 1/fan_in),
    every time tap distinct) and saves it to `folder` with save_pretrained; returns (vae, folder)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in vae.named_parameters():
            if pname.endswith("gamma"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif pname.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    vae.save_pretrained(folder)
    return vae, folder


def transformer_inputs(folder, arch):
    """Inputs of a small FLUX.1 ("flux"), FLUX.2 or Qwen-Image ("qwen-image") transformer forward for
    `folder`'s config (fixed seed)."""
    import torch
    cfg = json.load(open(os.path.join(folder, "transformer", "config.json")))
    g = torch.Generator().manual_seed(11)
    h, w, txt = 4, 6, 8
    inputs = {
        "hidden_states": torch.randn(1, h * w, cfg["in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(1, txt, cfg["joint_attention_dim"], generator=g),
        "timestep": torch.tensor([0.7]),
    }
    if arch == "qwen-image":  # QwenImagePipeline's inputs: a text mask (2 padded tokens), img_shapes (1, h, w)
        inputs["encoder_hidden_states_mask"] = torch.tensor([[1] * (txt - 2) + [0, 0]])
        inputs["img_shapes"] = torch.tensor([[1, h, w]], dtype=torch.int64)
        return {k: v.contiguous() for k, v in inputs.items()}
    if arch == "flux":
        img_ids = torch.zeros(h, w, 3)
        img_ids[..., 1] = torch.arange(h)[:, None]
        img_ids[..., 2] = torch.arange(w)[None, :]
        inputs["img_ids"], inputs["txt_ids"] = img_ids.reshape(h * w, 3), torch.zeros(txt, 3)
        inputs["pooled_projections"] = torch.randn(1, cfg["pooled_projection_dim"], generator=g)
    else:  # Flux2Pipeline's ids: (0, row, col, 0) and (0, 0, 0, l)
        one = torch.arange(1)
        inputs["img_ids"] = torch.cartesian_prod(one, torch.arange(h), torch.arange(w), one).float()
        inputs["txt_ids"] = torch.cartesian_prod(one, one, one, torch.arange(txt)).float()
    if cfg.get("guidance_embeds", arch != "flux"):
        inputs["guidance"] = torch.tensor([3.5])
    return {k: v.contiguous() for k, v in inputs.items()}


def run_cases(harness, cases, prefix):
    """The rest of main() of a `SCRIPT TPRUN MPIRUN CASE` test script: runs cases[CASE](work) in a fresh
    temporary folder, prints the verdict and returns the exit status."""
    import torch
    case = sys.argv[3]
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix=f"{prefix}-{case}-")
    try:
        cases[case](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'FAILED' if harness.failures else 'OK'}: {harness.failures} failure(s)")
    return 1 if harness.failures else 0
