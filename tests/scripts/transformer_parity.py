"""What the diffusers transformer parity scripts share (flux2_parity.py, qwen_image_parity.py).

Each script builds its family's diffusers class at test time, saves it, runs tprun on it under
mpirun and compares with diffusers' own forward. Shared here, parameterised by the family where
the two differ:
  - STATE (tprun and mpirun from the command line, the failures so far) and check(): an ok / FAIL
    line, the failures counted into the exit status of main();
  - build_model(): the class on the meta device, materialised on the CPU and EVERY parameter
    redrawn from a seeded generator (matrices ~ N(0, clamp(1/sqrt(fan_in), 0.02, 0.2)), biases ~
    N(0, bias_std), norm weights ~ N(1, 0.1));
  - Work: a model saved in a temporary folder with its inputs (the family's input maker) and the
    output of the family's diffusers forward;
  - mpirun(), tprun_forward(), tprun_inspect(): tprun runs with a hang timeout;
  - compare(), expect_refusal(), check_defaults_stripped(), check_allreduce_count(),
    expect_wrong_shape_refused(): the checks of the cases;
  - plan_entry(): the `_tp_plan` entry (key, style) that covers a module name;
  - main(): the case dispatch (`SCRIPT TPRUN MPIRUN [CASE ...]`, all cases when none given).
"""
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file


class State:
    """The command line's tprun and mpirun (set by main()) and the failed checks so far."""

    def __init__(self):
        self.tprun = self.mpirun = None
        self.failures = []


STATE = State()


def check(ok, msg):
    print(f"{'ok  ' if ok else 'FAIL'} {msg}", flush=True)
    if not ok:
        STATE.failures.append(msg)
    return ok


# ---------------------------------------------------------------------------------------------
# models, inputs, runs


def build_model(cls, cfg, seed, init=True, bias_std=None, after_empty=None):
    """diffusers' class `cls` with every parameter redrawn from a seeded generator (fp32, CPU).
    bias_std: the std of the biases (None: the class has none, asserted); after_empty(model): a
    fix-up after to_empty, for state the meta device left behind that is not a parameter."""
    with torch.device("meta"):  # skip diffusers' default init (slow at 3072 width)
        model = cls(**cfg)
    model = model.to_empty(device="cpu")
    if after_empty is not None:
        after_empty(model)
    assert not list(model.buffers()), "unexpected buffers (would stay uninitialised)"
    if init:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim >= 2:
                    std = min(max(1.0 / math.sqrt(p.shape[1]), 0.02), 0.2)
                    p.copy_(torch.randn(p.shape, generator=g) * std)
                elif name.endswith(".bias"):
                    assert bias_std is not None, name
                    p.copy_(torch.randn(p.shape, generator=g) * bias_std)
                else:  # RMSNorm weights
                    assert "norm" in name, name
                    p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def mpirun(np_, *args, timeout=180):
    cmd = [STATE.mpirun, "--oversubscribe", "-np", str(np_), STATE.tprun, *args, "--log-dir", ""]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s (hang?)"
    return r.returncode, r.stdout + r.stderr


def tprun_forward(model_dir, inputs_path, out_path, tp, dtype="fp32", timeout=180, extra=()):
    rc, out = mpirun(tp, "forward", "--model", model_dir, "--inputs", inputs_path, "--out", out_path,
                     "--tp", str(tp), "--dtype", dtype, *extra, timeout=timeout)
    if rc != 0:
        return None, f"exit {rc}: {(out or '')[-2000:]}"
    return load_file(out_path)["sample"].float(), None


def tprun_inspect(folder):
    """`tprun inspect FOLDER --json --tp 2` (one process); the CompletedProcess."""
    return subprocess.run([STATE.tprun, "inspect", folder, "--json", "--tp", "2"], capture_output=True, text=True,
                          timeout=120)


class Work:
    """A model saved in a temporary folder with its inputs and diffusers' output. The family gives
    its model builder build(cfg, seed), its input maker make_inputs() (called once) and its
    diffusers forward(model, inputs, dtype); the folder is named `{prefix}_{name}_...`."""

    def __init__(self, prefix, name, cfg, seed, build, make_inputs, forward, dtype=torch.float32):
        self.name, self.cfg = name, cfg
        self.dir = tempfile.mkdtemp(prefix=f"{prefix}_{name}_")
        self.model = build(cfg, seed)
        self.model_dir = os.path.join(self.dir, "model")
        self.model.save_pretrained(self.model_dir)
        self.inputs = make_inputs()
        self.inputs_path = self.save_inputs("inputs", self.inputs)
        if dtype != torch.float32:
            self.model = self.model.to(dtype)
        self.dtype = dtype
        self.expected = forward(self.model, self.inputs, dtype)

    def save_inputs(self, tag, inputs):
        path = os.path.join(self.dir, f"{tag}.safetensors")
        save_file(inputs, path)
        return path

    def out(self, tag):
        return os.path.join(self.dir, f"out_{tag}.safetensors")

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# checks


def compare(label, sample, expected, tol, err):
    if err is not None:
        return check(False, f"{label}: tprun forward {err}")
    if sample.shape != expected.shape:
        return check(False, f"{label}: shape {list(sample.shape)} vs diffusers {list(expected.shape)}")
    diff = (sample - expected).abs()
    dmax = diff.max().item()
    return check(math.isfinite(dmax) and dmax <= tol,
                 f"{label}: max abs diff {dmax:.3g}, mean {diff.mean().item():.3g} (tolerance {tol:.3g}; "
                 f"max|sample| {expected.abs().max().item():.3g})")


def plan_entry(plan, module_name):
    """(key, style) of the first `_tp_plan` entry whose key matches module_name, each `*` a block
    index; (None, None) when none does."""
    for key, style in plan.items():
        if re.fullmatch(re.escape(key).replace(r"\*", r"\d+"), module_name):
            return key, style
    return None, None


def check_defaults_stripped(name, folder, cls, tensors):
    """Rewrites FOLDER/config.json without the fields equal to the defaults of cls.__init__ and
    checks that `tprun inspect` gives the same tensor table (tprun's defaults must be diffusers')."""
    cfg_path = os.path.join(folder, "config.json")
    full = json.load(open(cfg_path))
    defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    stripped = {k: v for k, v in full.items() if k not in defaults or json.loads(json.dumps(defaults[k])) != v}
    json.dump(stripped, open(cfg_path, "w"))
    r2 = tprun_inspect(folder)
    same = r2.returncode == 0 and json.loads(r2.stdout)["components"][0]["tensors"] == tensors
    check(same, f"table {name}: config.json without the default-valued fields "
                f"{sorted(set(full) - set(stripped))} gives the same table ({r2.stderr[-300:]})")


def check_allreduce_count(model_dir, want, formula):
    """`tprun verify --tp 2` passes and counts `want` AllReduces per forward (its plan's too), and
    want + 1 with --shard-modulation; formula: how want is made, for the message."""
    for extra, plan in (((), want), (("--shard-modulation",), want + 1)):
        rc, out = mpirun(2, "verify", "--model", model_dir, "--tp", "2", *extra)
        m = re.search(r"all_reduce calls per forward: (\d+) \(plan: (\d+)\)", out or "")
        label = f"allreduce verify tp 2 {' '.join(extra)}".rstrip()
        if not check(rc == 0 and m is not None, f"{label}: exit {rc}; {(out or '')[-1500:] if rc else ''}"):
            continue
        n, p = int(m.group(1)), int(m.group(2))
        check(n == p == plan, f"{label}: {n} AllReduces per forward (plan {p}; expected "
                              f"{formula}{' + 1' if extra else ''} = {plan})")


def expect_refusal(label, np_, args, patterns):
    rc, out = mpirun(np_, *args, timeout=90)
    if rc is None:
        check(False, f"{label}: {out}")
        return
    lines = [ln for ln in out.splitlines() if all(p in ln for p in patterns)]
    ranks = {m.group(1) for ln in lines for m in [re.search(r"\[r(\d+)/", ln)] if m}
    check(rc != 0 and len(ranks) == np_,
          f"{label}: exit {rc}, message on ranks {sorted(ranks)} of {np_}: "
          f"{lines[0].strip() if lines else out[-800:]}")


def expect_wrong_shape_refused(model_dir, args, name):
    """Tensor `name` of MODEL_DIR's checkpoint rewritten (with safetensors' API) two columns short:
    the 2-rank run `args` must be refused naming it with both shapes."""
    f = os.path.join(model_dir, "diffusion_pytorch_model.safetensors")
    state = load_file(f)
    good = list(state[name].shape)
    state[name] = state[name][:, :-2].contiguous()
    save_file(state, f, metadata={"format": "pt"})
    bad = list(state[name].shape)
    fmt_shape = lambda s: "[" + ", ".join(map(str, s)) + "]"
    expect_refusal("validation wrong shape", 2, args, [name, fmt_shape(good), fmt_shape(bad)])


# ---------------------------------------------------------------------------------------------
# the case dispatch


def main(cases):
    """`SCRIPT TPRUN MPIRUN [CASE ...]`: runs the named cases of `cases` (name -> function), all
    when none are named; returns the exit status (1 when any check failed)."""
    STATE.tprun, STATE.mpirun = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(cases)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t_start = time.time()
    for name in names:
        t0 = time.time()
        cases[name]()
        print(f"  [{name}] {time.time() - t0:.1f}s", flush=True)
    failures = STATE.failures
    print(f"{'FAILED' if failures else 'OK'}: {len(failures)} failures ({time.time() - t_start:.1f}s)")
    return 1 if failures else 0
