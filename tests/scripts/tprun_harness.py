"""What the end-to-end parity scripts share: running tprun under mpirun with a hang timeout,
`init-model` folders, and ok / FAIL lines counted into the script's exit status."""
import os
import subprocess


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

    def init_model(self, work, arch, name=None):
        d = os.path.join(work, name or arch)
        r = subprocess.run([self.tprun, "init-model", d, "--arch", arch], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"init-model {arch} failed: {r.stderr}")
        return d
