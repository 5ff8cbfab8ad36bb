"""Which pipeline classes the tprun binary registers, and the `init-model` preset that writes a folder of each,
both asked of the binary itself so that a test looping over them covers a new family without an edit.

- The registered classes: `tprun generate` on a folder whose model_index.json names a class no family registers
  is refused with "is not a pipeline tprun can run (known: A, B, ...)", the list load_pipeline keeps
  (src/pipelines/pipeline.cpp, pipeline_names()). No command prints that list otherwise.
- The presets: `tprun init-model --help` lists every --arch the families register ("flux (FLUX.1, FluxPipeline),
  ..."); each arch's folder, written once, says its class in model_index.json's _class_name (the folder, not the
  help text, is what the tests load).

A registered class that no preset writes is a failure (`preset_folders` raises SystemExit naming it): its
folders could not be tested.
"""
import json
import os
import re
import subprocess
import tempfile

_KNOWN = re.compile(r"is not a pipeline tprun can run \(known: ([^)]*)\)")
_PROBE_CLASS = "TprunProbeNoSuchPipeline"


def registered_pipelines(tprun):
    """The classes `tprun generate` loads, in the binary's order (from its refusal of an unknown class)."""
    with tempfile.TemporaryDirectory(prefix="tprun-registered-") as work:
        d = os.path.join(work, "model")
        os.makedirs(d)
        with open(os.path.join(d, "model_index.json"), "w") as f:
            json.dump({"_class_name": _PROBE_CLASS, "_diffusers_version": "0.40.0"}, f)
        r = subprocess.run([tprun, "generate", "--model", d, "--prompt", "x", "--out", os.path.join(work, "never.png"),
                            "--log-dir", ""], capture_output=True, text=True, timeout=120)
    m = _KNOWN.search(r.stdout + r.stderr)
    if r.returncode == 0 or not m:
        raise SystemExit(f"FAIL: `tprun generate` on a {_PROBE_CLASS} folder did not list the registered pipelines "
                         f"(exit {r.returncode}):\n{(r.stdout + r.stderr)[-1500:]}")
    names = [n.strip() for n in m.group(1).split(",") if n.strip()]
    if not names:
        raise SystemExit("FAIL: the binary registers no pipeline class")
    return names


def preset_archs(tprun):
    """[(arch, help)] for every `init-model --arch` value, in --help's order ("flux", "FLUX.1, FluxPipeline")."""
    r = subprocess.run([tprun, "init-model", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join((r.stdout + r.stderr).split())  # the help is wrapped: one line again
    m = re.search(r"pipeline architecture: (.*?)(?: --|$)", text)
    if not m:
        raise SystemExit(f"FAIL: `tprun init-model --help` has no 'pipeline architecture:' list:\n{text[-1500:]}")
    archs = re.findall(r"(?:^|(?<=\), ))([A-Za-z0-9._-]+) \(((?:[^()]|\([^()]*\))*)\)", m.group(1))
    if not archs:
        raise SystemExit(f"FAIL: no architecture found in init-model's help: {m.group(1)}")
    return archs


def init_model(tprun, folder, arch, *extra):
    """`tprun init-model FOLDER --arch ARCH EXTRA...`; returns `folder`."""
    r = subprocess.run([tprun, "init-model", folder, "--arch", arch, *extra], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: init-model --arch {arch} {' '.join(extra)}: exit {r.returncode}\n{r.stderr[-1500:]}")
    return folder


def folder_class(folder):
    with open(os.path.join(folder, "model_index.json")) as f:
        return json.load(f)["_class_name"]


def preset_folders(tprun, work, classes=None):
    """{class: (arch, folder)} for every registered class (or those of `classes`): the first --arch whose
    folder is of that class, written under `work/preset-ARCH`. SystemExit naming any class without a preset."""
    registered = registered_pipelines(tprun)
    wanted = list(classes) if classes else registered
    unknown = [c for c in wanted if c not in registered]
    if unknown:
        raise SystemExit(f"FAIL: {unknown} not registered by the binary (registered: {registered})")
    found = {}
    archs = preset_archs(tprun)
    # The archs whose help names a wanted class first (one folder each), then every other one.
    ordered = [a for a, text in archs if any(c in text for c in wanted)] + \
              [a for a, text in archs if not any(c in text for c in wanted)]
    for arch in ordered:
        if all(c in found for c in wanted):
            break
        folder = init_model(tprun, os.path.join(work, f"preset-{arch}"), arch)
        cls = folder_class(folder)
        if cls in wanted and cls not in found:
            found[cls] = (arch, folder)
    missing = [c for c in wanted if c not in found]
    if missing:
        raise SystemExit(f"FAIL: registered pipeline class(es) {missing} have no `tprun init-model` preset "
                         f"(archs: {[a for a, _ in archs]}): register one with TPRUN_REGISTER_PRESET so their "
                         "folders are tested")
    return {c: found[c] for c in wanted}
