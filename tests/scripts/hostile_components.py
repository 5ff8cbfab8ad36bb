"""Hostile pipeline folders, part 1: what hostile_folders.py's cases share (tprun under mpirun, expected
refusals, folder edits), the registered pipelines they loop over, and the cases about a folder's components,
run for every class the binary registers (registered_pipelines.py: a new family is covered without an edit,
and a registered class with no init-model preset fails every case).

Cases (`hostile_folders.py TPRUN MPIRUN CASE`; every one for every registered pipeline class):
  component_class_model_index  model_index.json naming "EvilModel" (transformer), "../../etc" (vae class and a
               component name), an unknown extra component, each tokenizer as "EvilTokenizer", and for the
               transformer, vae and text_encoder every other registered family's class (a QwenImagePipeline
               naming FluxTransformer2DModel, ...): exit 4 naming model_index.json and the component, on every
               rank, before any weight is read.
  component_class_config  transformer/config.json _class_name "EvilModel" and 5, vae/config.json 5, and every
               other family's transformer folder in its place: exit 4 naming the config file and _class_name;
               `tprun forward --component transformer` on _class_name 5 says so too.
  component_class_every_pipeline  a wrong class in model_index.json (transformer, vae, text_encoder,
               scheduler), in transformer/config.json's _class_name and in the text encoder's architectures
               ([], a string, another class), and every other family's text_encoder folder: exit 4 naming the
               file and the field, no weight read.
  index_class_name  model_index.json _class_name 5, "" or missing: exit 4 naming _class_name, for generate,
               tokenize and inspect.
  model_index_not_missing  a model_index.json that cannot be stat'ed (a symlink loop) or is a folder: said as it
               is, never "no model_index.json".
  missing_component  each component model_index.json names, its folder gone (exit 4 naming model_index.json and
               the component) and gone from model_index.json too (exit 4 naming it): before any weight is read.
  corrupt_config  each component's config.json / scheduler_config.json cut in half and not JSON at all: exit 4
               naming the file, before any weight is read.
  truncated_safetensors  each *.safetensors file of the folder cut short (in its data, and inside its header):
               exit 4 naming the file on every rank, before any weight is read; never a crash or a hang.
"""
import json
import os
import shutil
import subprocess

from registered_pipelines import preset_folders

H = None  # tprun_harness.Harness, set by hostile_folders.py
WEIGHTS_READ = "bytes on this rank"  # the pipeline's load line: a weight was read
_FOLDERS = {}


def run(args, np_=1, timeout=300, env=None):
    """(exit code, log) like Harness.run, but the log decoded leniently (prompts with invalid UTF-8);
    np_ 0: tprun alone, without mpirun (file tools such as `tokenize`)."""
    cmd = [H.mpirun, "--oversubscribe", "-np", str(np_), H.tprun, *args, "--log-dir", ""] if np_ else [H.tprun, *args]
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "timed out (hang?)"
    return r.returncode, (r.stdout + r.stderr).decode("utf-8", "replace")


def generate_args(folder, out, prompt="a red fox", extra=()):
    """One small result: 64 x 64, 2 steps, one frame (what an image pipeline makes, and the one-frame video of
    a video pipeline, whose default is many frames), so every family writes it to the same PNG."""
    return ["generate", "--model", folder, "--prompt", prompt, "--height", "64", "--width", "64", "--steps", "2",
            "--frames", "1", "--out", out, *extra]


def tokenize_args(folder):
    return ["tokenize", "--model", folder, "--prompt", "a red fox"]


def expect(label, args, code, wants, np_=2, absent=(WEIGHTS_READ,), timeout=300):
    """`args` ends with exit `code`, each of `wants` on (at least) np_ lines, none of `absent` in the log."""
    rc, log = run(args, np_=np_, timeout=timeout)
    counts = [sum(1 for line in log.splitlines() if w in line) for w in wants]
    missing = [a for a in absent if a in log]
    ok = rc == code and all(c >= max(np_, 1) for c in counts) and not missing
    H.check(ok, f"{label}: exit {rc} (want {code}), {list(zip(wants, counts))} of {max(np_, 1)} ranks"
            + (f", '{missing}' in the log" if missing else "") + ("" if ok else f"\n{log[-1500:]}"))
    return log


def edit_json(path, fn):
    with open(path) as f:
        data = json.load(f)
    fn(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def copy_model(work, src, name, edit=None):
    d = os.path.join(work, name)
    shutil.copytree(src, d)
    if edit:
        edit(d)
    return d


def index_edit(fn):
    return lambda d: edit_json(os.path.join(d, "model_index.json"), fn)


def model_index(folder):
    with open(os.path.join(folder, "model_index.json")) as f:
        return json.load(f)


def components(folder):
    """{name: [library, class]} of the non-null components model_index.json names."""
    return {k: v for k, v in model_index(folder).items()
            if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[1] is not None}


def pipelines(work):
    """{class: init-model folder} for every registered pipeline class (written once per run under `work`)."""
    if not _FOLDERS:
        _FOLDERS.update({cls: folder for cls, (_, folder) in preset_folders(H.tprun, work).items()})
    return dict(_FOLDERS)


def every_pipeline(why_not=None, applies=None):
    """A case run once per registered pipeline class: fn(work, cls, folder, folders). `why_not` {class: reason}
    and `applies(cls, folder)` -> reason or None say where it does not apply (printed); it must apply to one."""
    def wrap(fn):
        def case(work):
            folders = pipelines(work)
            ran = 0
            for cls, folder in folders.items():
                why = (why_not or {}).get(cls) or (applies(cls, folder) if applies else None)
                if why:
                    print(f"n/a  {cls}: {why}", flush=True)
                    continue
                print(f"---- {cls}", flush=True)
                fn(work, cls, folder, folders)
                ran += 1
            H.check(ran > 0, f"the case ran for {ran} of {len(folders)} registered pipelines")
        case.__doc__ = fn.__doc__
        return case
    return wrap


def others(cls, folders, comp):
    """The distinct classes other registered families name for `comp`, not `cls`'s own: [(library, class, folder)]."""
    own = components(folders[cls]).get(comp)
    seen, out = set(), []
    for other, folder in folders.items():
        spec = components(folder).get(comp)
        if other != cls and spec and spec != own and spec[1] not in seen:
            seen.add(spec[1])
            out.append((spec[0], spec[1], folder))
    return out


# ---- component classes ----------------------------------------------------------------------------------

@every_pipeline()
def case_component_class_model_index(work, cls, src, folders):
    out = os.path.join(work, "never.png")

    def set_class(comp, lib, name):
        return index_edit(lambda j: j.__setitem__(comp, [lib, name]))

    d = copy_model(work, src, f"{cls}-evil-transformer", set_class("transformer", "diffusers", "EvilModel"))
    expect(f"{cls} transformer EvilModel", generate_args(d, out), 4, ["model_index.json", '"EvilModel"]'])
    expect(f"{cls} tokenize on EvilModel", tokenize_args(d), 4, ['"EvilModel"]'], np_=0)
    d = copy_model(work, src, f"{cls}-evil-path-class", set_class("vae", "diffusers", "../../etc"))
    expect(f"{cls} vae class ../../etc", generate_args(d, out), 4, ["model_index.json", "'../../etc'"])
    # A component whose name walks out of the folder to a directory that exists.
    os.makedirs(os.path.join(work, "nest"), exist_ok=True)
    os.makedirs(os.path.join(work, "etc"), exist_ok=True)
    d = copy_model(work, src, os.path.join("nest", f"{cls}-evil-path-name"),
                   index_edit(lambda j: j.__setitem__("../../etc", ["diffusers", "AutoencoderKL"])))
    expect(f"{cls} component named ../../etc", generate_args(d, out), 4, ["'../../etc' is not a plain folder name"])

    def extra(d):
        os.makedirs(os.path.join(d, "evil"))
        edit_json(os.path.join(d, "model_index.json"), lambda j: j.__setitem__("evil", ["diffusers", "EvilModel"]))
    d = copy_model(work, src, f"{cls}-evil-extra", extra)
    expect(f"{cls} unknown extra component", generate_args(d, out), 4, ["component 'evil' (EvilModel) is not one"])
    for comp, (lib, _) in sorted(components(src).items()):
        if comp.startswith("tokenizer"):
            d = copy_model(work, src, f"{cls}-{comp}-evil", set_class(comp, lib, "EvilTokenizer"))
            expect(f"{cls} {comp} EvilTokenizer", generate_args(d, out), 4, [comp, "EvilTokenizer"])
    # Each model component named as another registered family's class (issue 32: a QwenImagePipeline naming
    # FluxTransformer2DModel ran to exit 0 before every pipeline had a component table).
    for comp in ("transformer", "vae", "text_encoder"):
        for lib, other, _ in others(cls, folders, comp):
            d = copy_model(work, src, f"{cls}-{comp}-{other}", set_class(comp, lib, other))
            expect(f"{cls} model_index.json {comp} {other}", generate_args(d, out), 4,
                   [f"model_index.json: {comp} is [\"{lib}\", \"{other}\"]", cls])
    H.check(not os.path.exists(out), "no image was written")


def config_class(comp, value):
    return lambda d: edit_json(os.path.join(d, comp, "config.json"), lambda j: j.__setitem__("_class_name", value))


@every_pipeline()
def case_component_class_config(work, cls, src, folders):
    import torch
    from safetensors.torch import save_file
    out = os.path.join(work, "never.png")
    d = copy_model(work, src, f"{cls}-evil-config", config_class("transformer", "EvilModel"))
    expect(f"{cls} transformer/config.json EvilModel", generate_args(d, out), 4,
           [os.path.join("transformer", "config.json") + ": _class_name 'EvilModel'"])
    d5 = copy_model(work, src, f"{cls}-five-config", config_class("transformer", 5))
    expect(f"{cls} transformer/config.json _class_name 5", generate_args(d5, out), 4,
           [os.path.join("transformer", "config.json") + ": _class_name is not a string (found 5)"])
    d = copy_model(work, src, f"{cls}-five-vae", config_class("vae", 5))
    expect(f"{cls} vae/config.json _class_name 5", generate_args(d, out), 4,
           [os.path.join("vae", "config.json") + ": _class_name is not a string (found 5)"])
    for _, other, other_folder in others(cls, folders, "transformer"):
        def swap(d, other_folder=other_folder):
            shutil.rmtree(os.path.join(d, "transformer"))
            shutil.copytree(os.path.join(other_folder, "transformer"), os.path.join(d, "transformer"))
        d = copy_model(work, src, f"{cls}-folder-{other}", swap)
        expect(f"{other} transformer folder in a {cls}", generate_args(d, out), 4,
               [f"_class_name '{other}' is not a class a {cls} accepts"])
    # The component alone: forward names the non-string class too.
    inputs = os.path.join(work, "inputs.safetensors")
    save_file({"hidden_states": torch.zeros(1)}, inputs)
    rc, log = run(["forward", "--model", d5, "--component", "transformer", "--inputs", inputs,
                   "--out", os.path.join(work, "out.safetensors")])
    H.check(rc in (3, 4) and "_class_name is not a string (found 5)" in log and "''" not in log,
            f"{cls} forward on _class_name 5: exit {rc}, says it is not a string" + ("" if rc in (3, 4) else log[-800:]))


@every_pipeline()
def case_component_class_every_pipeline(work, cls, src, folders):
    out = os.path.join(work, "never.png")
    index = model_index(src)
    # A wrong class in model_index.json, for every component it names.
    for comp, wrong in (("transformer", "EvilModel"), ("vae", "AutoencoderKLHunyuanVideo"),
                        ("text_encoder", "T5EncoderModel"), ("scheduler", "DDIMScheduler")):
        lib = index[comp][0]
        d = copy_model(work, src, f"{cls}-{comp}-{wrong}", index_edit(lambda j: j.__setitem__(comp, [lib, wrong])))
        expect(f"{cls} model_index.json {comp} {wrong} (tokenize)", tokenize_args(d), 4,
               [f"model_index.json: {comp} is [\"{lib}\", \"{wrong}\"]"], np_=0)
    # The component's own config.json: _class_name, then architectures.
    for value, want in (("EvilModel", "_class_name 'EvilModel' is not a class"),
                        (5, "_class_name is not a string (found 5)"), ("", "_class_name '' is not a class")):
        d = copy_model(work, src, f"{cls}-config-{value}", config_class("transformer", value))
        expect(f"{cls} transformer/config.json _class_name {value!r}", tokenize_args(d), 4,
               [os.path.join("transformer", "config.json") + ": " + want], np_=0)
    for value, want in ((["EvilModel"], "architectures[0] 'EvilModel' is not a class"),
                        ([], "architectures must be a list of class names (found [])"),
                        ("X", "architectures must be a list of class names (found \"X\")")):
        d = copy_model(work, src, f"{cls}-arch-{json.dumps(value)}", lambda d: edit_json(
            os.path.join(d, "text_encoder", "config.json"), lambda j: j.__setitem__("architectures", value)))
        expect(f"{cls} text_encoder/config.json architectures {value!r}", tokenize_args(d), 4,
               [os.path.join("text_encoder", "config.json") + ": " + want], np_=0)
    # Another family's text_encoder/ folder (a Qwen-Image folder with klein's Qwen3ForCausalLM ran to exit 0).
    for _, other, other_folder in others(cls, folders, "text_encoder"):
        def swap(d, other_folder=other_folder):
            shutil.rmtree(os.path.join(d, "text_encoder"))
            shutil.copytree(os.path.join(other_folder, "text_encoder"), os.path.join(d, "text_encoder"))
        d = copy_model(work, src, f"{cls}-with-{other}", swap)
        arch = json.load(open(os.path.join(d, "text_encoder", "config.json")))["architectures"][0]
        expect(f"{cls} with a {other} text_encoder/", generate_args(d, out), 4,
               [os.path.join("text_encoder", "config.json") + f": architectures[0] '{arch}' is not a class a "
                f"{cls} accepts"])
    H.check(not os.path.exists(out), "no image was written")


@every_pipeline()
def case_index_class_name(work, cls, src, folders):
    out = os.path.join(work, "never.png")
    for label, fn, want in (("5", lambda j: j.__setitem__("_class_name", 5), "_class_name is not a string (found 5)"),
                            ("empty", lambda j: j.__setitem__("_class_name", ""), "_class_name is empty"),
                            ("missing", lambda j: j.pop("_class_name"), "_class_name is missing")):
        d = copy_model(work, src, f"{cls}-class-{label}", index_edit(fn))
        line = "model_index.json: " + want
        expect(f"{cls} generate, _class_name {label}", generate_args(d, out), 4, [line])
        expect(f"{cls} tokenize, _class_name {label}", tokenize_args(d), 4, [line], np_=0)
        expect(f"{cls} inspect, _class_name {label}", ["inspect", d], 4, [line], np_=0)
    H.check(not os.path.exists(out), "no image was written")


@every_pipeline()
def case_model_index_not_missing(work, cls, src, folders):
    loop = copy_model(work, src, f"{cls}-loop")
    os.remove(os.path.join(loop, "model_index.json"))
    os.symlink("model_index.json", os.path.join(loop, "model_index.json"))
    for args in (tokenize_args(loop), ["inspect", loop]):
        rc, log = run(args, np_=0)
        H.check(rc not in (0, 3) and "no model_index.json" not in log and "symbolic links" in log,
                f"{cls} {args[0]} on a model_index.json symlink loop: exit {rc}, says what stat said\n{log[-600:]}")
    folder = copy_model(work, src, f"{cls}-index-folder")
    os.remove(os.path.join(folder, "model_index.json"))
    os.makedirs(os.path.join(folder, "model_index.json"))
    expect(f"{cls} model_index.json a folder", tokenize_args(folder), 4, ["model_index.json is not a regular file"],
           np_=0)
    # The folder really without one still says so.
    none = os.path.join(work, f"{cls}-none")
    os.makedirs(none)
    rc, log = run(tokenize_args(none), np_=0)
    H.check(rc == 3 and "no model_index.json" in log, f"a folder without model_index.json: exit {rc}")


# ---- missing, corrupt and truncated components ----------------------------------------------------------

@every_pipeline()
def case_missing_component(work, cls, src, folders):
    out = os.path.join(work, "never.png")
    for comp in sorted(components(src)):
        def gone(d, comp=comp):
            shutil.rmtree(os.path.join(d, comp))
        d = copy_model(work, src, f"{cls}-no-{comp}-folder", gone)
        expect(f"{cls} {comp}/ missing (model_index.json names it)", generate_args(d, out), 4,
               [f"model_index.json: component '{comp}' (", "has no folder"])

        def unnamed(d, comp=comp):
            gone(d)
            edit_json(os.path.join(d, "model_index.json"), lambda j: j.pop(comp))
        d = copy_model(work, src, f"{cls}-no-{comp}", unnamed)
        expect(f"{cls} {comp} missing from model_index.json too", generate_args(d, out), 4,
               [f"model_index.json names no '{comp}' component (a {cls} needs it)"])
    H.check(not os.path.exists(out), "no image was written")


def config_file(folder, comp):
    for name in ("config.json", "scheduler_config.json", "tokenizer_config.json", "processor_config.json"):
        if os.path.exists(os.path.join(folder, comp, name)):
            return os.path.join(comp, name)
    return None


@every_pipeline()
def case_corrupt_config(work, cls, src, folders):
    out = os.path.join(work, "never.png")
    for comp in sorted(components(src)):
        rel = config_file(src, comp)
        if rel is None:
            continue
        for label, cut in (("cut in half", lambda b: b[:len(b) // 2]), ("not JSON", lambda b: b"{ not json ]\n")):
            def corrupt(d, rel=rel, cut=cut):
                path = os.path.join(d, rel)
                with open(path, "rb") as f:
                    data = f.read()
                with open(path, "wb") as f:
                    f.write(cut(data))
            d = copy_model(work, src, f"{cls}-{comp}-{label.replace(' ', '-')}", corrupt)
            expect(f"{cls} {rel} {label}", generate_args(d, out), 4, [rel])
    H.check(not os.path.exists(out), "no image was written")


def weight_files(folder):
    """The *.safetensors files of `folder`'s components, relative to it, in name order."""
    found = []
    for comp in sorted(components(folder)):
        for root, _, files in os.walk(os.path.join(folder, comp)):
            found += [os.path.relpath(os.path.join(root, f), folder) for f in sorted(files) if f.endswith(".safetensors")]
    return found


@every_pipeline()
def case_truncated_safetensors(work, cls, src, folders):
    out = os.path.join(work, "never.png")
    files = weight_files(src)
    H.check(bool(files), f"{cls}: the folder has weight files ({len(files)})")
    for rel in files:
        size = os.path.getsize(os.path.join(src, rel))
        with open(os.path.join(src, rel), "rb") as f:
            header = 8 + int.from_bytes(f.read(8), "little")
        for label, keep in (("its data cut short", size - max(1, (size - header) // 2)), ("cut inside its header",
                                                                                          header // 2)):
            def cut(d, rel=rel, keep=keep):
                os.truncate(os.path.join(d, rel), keep)
            d = copy_model(work, src, f"{cls}-{rel.replace(os.sep, '-')}-{keep}", cut)
            expect(f"{cls} {rel} {label}", generate_args(d, out), 4, [os.path.basename(rel)])
    H.check(not os.path.exists(out), "no image was written")


CASES = {
    "component_class_model_index": case_component_class_model_index,
    "component_class_config": case_component_class_config,
    "component_class_every_pipeline": case_component_class_every_pipeline,
    "index_class_name": case_index_class_name,
    "model_index_not_missing": case_model_index_not_missing,
    "missing_component": case_missing_component,
    "corrupt_config": case_corrupt_config,
    "truncated_safetensors": case_truncated_safetensors,
}
