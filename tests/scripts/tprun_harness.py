"""What the end-to-end parity scripts share: running tprun under mpirun with a hang timeout,
`init-model` folders, and ok / FAIL lines counted into the script's exit status."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch


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

    def init_model(self, work, arch, name=None):
        d = os.path.join(work, name or arch)
        r = subprocess.run([self.tprun, "init-model", d, "--arch", arch], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"init-model {arch} failed: {r.stderr}")
        return d


def transformer_inputs(folder, arch):
    """Inputs of a small FLUX.1 ("flux") or FLUX.2 transformer forward for `folder`'s config (fixed seed)."""
    cfg = json.load(open(os.path.join(folder, "transformer", "config.json")))
    g = torch.Generator().manual_seed(11)
    h, w, txt = 4, 6, 8
    inputs = {
        "hidden_states": torch.randn(1, h * w, cfg["in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(1, txt, cfg["joint_attention_dim"], generator=g),
        "timestep": torch.tensor([0.7]),
    }
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
    case = sys.argv[3]
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix=f"{prefix}-{case}-")
    try:
        cases[case](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'FAILED' if harness.failures else 'OK'}: {harness.failures} failure(s)")
    return 1 if harness.failures else 0
