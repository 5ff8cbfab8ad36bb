#!/usr/bin/env python3
"""Hostile input, requests: every request value is bounded in one place (generate's flags, a manifest's
[defaults], a requests file), then held to the pipeline's own limits and options; nothing is rendered
without an option it was given while recording it.

Cases (one ctest entry each; `hostile_requests.py TPRUN MPIRUN CASE`):
  max_sequence_length  Qwen-Image takes 513-1024 text tokens: [defaults] max_sequence_length = 1024
                       and a request's 700 run (exit 0), `tokenize --max-sequence-length 1024` too;
                       FLUX.1's 600 in [defaults] is refused before any weight, naming the file, the
                       key and FluxPipeline's limit of 512, as is `tokenize` with 600
  unused_options       a Qwen-Image request with "guidance" is recorded failed naming guidance (the
                       other request is done and its PNG records no guidance); [defaults] guidance
                       and `generate --guidance` are refused before any weight; FLUX.2 [dev]'s
                       [defaults] true_cfg_scale likewise
  one_step             Qwen-Image's scheduler (shift_terminal) cannot take one step: [defaults]
                       steps = 1 is refused before any weight naming defaults.steps and
                       shift_terminal; a request's steps 1 is recorded failed naming steps while the
                       other is done; `generate --steps 1` exit 3
  numeric_bounds       generate --guidance 1e308, --true-cfg-scale 1e308, --height
                       9223372036854775792 --width 16: exit 3 naming the flag (no overflow, no
                       backtrace); `run --set defaults.steps=1e400`: a number out of range
  scheduler_bounds     scheduler_config.json base_shift 1e308 / max_shift -1e308 / shift 1e308:
                       exit 4 naming the file and the key, before any step
  nan_hint             NaN weights in an fp32 transformer: the request error says fp32 is not the
                       cause (never "try fp32")
  frames_values        `frames` (issue 32): a requests file's 0, -2, 99999999999, 1e30, 2.5, "9" and
                       `--set defaults.frames=0` end the job before any weight naming file:line and
                       the field; [defaults] frames = 9 and `generate --frames 9` are refused by
                       FluxPipeline (it makes images) before any weight, `generate --frames 0` by
                       the bound; in a job, a request's frames 9 is recorded failed naming frames
                       while frames 1 and no frames make the same pixels, and neither record nor PNG
                       mentions frames
  video_keys           `fps` and `guidance_2` (issue 33) and the video formats on an image pipeline: a
                       requests file's fps 0 / 241 / 2.5 and guidance_2 -1 / 1e9 / "x" end the job before
                       any weight naming file:line and the field; [defaults] fps and guidance_2,
                       output.formats mp4 and frames, `generate --fps`, `--guidance-2`, `--out x.mp4` are
                       refused by FluxPipeline by name before any weight, `--fps 0` by the bound; in a
                       job, requests with fps or guidance_2 are recorded failed naming the key while the
                       other is done, its record and PNG with neither
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tprun_harness import Harness, jsonl, results, run_cases, tiny_flux, write, write_manifest  # noqa: E402

H = None
LOADED = "loaded "  # the line a weight load prints


def qwen(work):
    return H.init_model(work, "qwen-image")


def qwen_manifest(work, model, rows, defaults=None, name="job"):
    """A Qwen-Image job of `rows` at 32 x 32, two steps (its scheduler's least), 32 text tokens."""
    req = jsonl(os.path.join(work, f"{name}.jsonl"), rows)
    return write_manifest(os.path.join(work, f"{name}.toml"), model, req, os.path.join(work, f"{name}-out"),
                          parallel={"tp": 1}, defaults=dict({"steps": 2}, **(defaults or {})))


def by_id(out):
    return {r["id"]: r for r in results(out)}


def png_text(path):
    from PIL import Image
    return dict(Image.open(path).text)


def gen(model, *extra, size=("32", "32")):
    return ["generate", "--model", model, "--prompt", "a red boat", "--height", size[0], "--width", size[1],
            "--max-sequence-length", "16", "--out", os.path.join(os.path.dirname(model), "g.png"), *extra]


def case_max_sequence_length(work):
    d = qwen(work)
    m = qwen_manifest(work, d, [{"id": "a", "prompt": "a red fox"},
                                {"id": "b", "prompt": "a lighthouse", "max_sequence_length": 700}],
                      defaults={"max_sequence_length": 1024})
    rc, log = H.run(["run", m], np_=1, timeout=300)
    out = os.path.join(work, "job-out")
    recs = by_id(out) if os.path.exists(os.path.join(out, "results.jsonl")) else {}
    H.check(rc == 0 and all(recs.get(k, {}).get("status") == "done" for k in "ab"),
            f"Qwen-Image job with [defaults] max_sequence_length 1024 and a request's 700: exit {rc}, "
            f"{ {k: v.get('status') for k, v in recs.items()} }" + ("" if rc == 0 else f"\n{log[-800:]}"))
    if recs.get("b", {}).get("status") == "done":
        t = png_text(os.path.join(out, "images", "b.png"))
        H.check(t.get("max_sequence_length") == "700", f"b.png records max_sequence_length 700 ({t.get('max_sequence_length')})")
    r = subprocess.run([H.tprun, "tokenize", "--model", d, "--prompt", "a red fox", "--max-sequence-length", "1024"],
                       capture_output=True, text=True)
    H.check(r.returncode == 0, f"tokenize Qwen-Image --max-sequence-length 1024: exit {r.returncode} {r.stderr[-300:]}")
    f = tiny_flux(H.tprun, os.path.join(work, "flux"))
    req = jsonl(os.path.join(work, "f.jsonl"), [{"id": "a", "prompt": "a red fox"}])
    fm = write_manifest(os.path.join(work, "f.toml"), f, req, os.path.join(work, "f-out"), parallel={"tp": 1},
                        defaults={"max_sequence_length": 600})
    line = next(i for i, l in enumerate(open(fm).read().splitlines(), 1) if l.startswith("max_sequence_length"))
    H.expect_config_error("FLUX.1 [defaults] max_sequence_length 600",
                          ["run", fm], f"{fm}:{line}: defaults.max_sequence_length: 600 is beyond FluxPipeline's "
                          "limit of 512 text tokens", absent=LOADED)
    r = subprocess.run([H.tprun, "tokenize", "--model", f, "--prompt", "a red fox", "--max-sequence-length", "600"],
                       capture_output=True, text=True)
    H.check(r.returncode == 3 and "FluxPipeline's limit of 512" in r.stderr,
            f"tokenize FLUX.1 --max-sequence-length 600: exit {r.returncode} (want 3) {r.stderr[-300:]}")


def case_unused_options(work):
    d = qwen(work)
    m = qwen_manifest(work, d, [{"id": "ok", "prompt": "a red fox"},
                                {"id": "g", "prompt": "a red fox", "guidance": 7.5}])
    rc, log = H.run(["run", m], np_=1, timeout=300)
    out = os.path.join(work, "job-out")
    recs = by_id(out) if os.path.exists(os.path.join(out, "results.jsonl")) else {}
    g = recs.get("g", {})
    H.check(rc == 6 and g.get("status") == "failed" and "guidance" in g.get("error", "")
            and "QwenImagePipeline does not use it" in g.get("error", ""),
            f"a Qwen-Image request with guidance 7.5: exit {rc} (want 6), recorded {g.get('status')}: "
            f"{g.get('error', '')[:200]}" + ("" if rc in (0, 6) else f"\n{log[-800:]}"))
    H.check(not os.path.exists(os.path.join(out, "images", "g.png")), "no image for the refused request")
    if recs.get("ok", {}).get("status") == "done":
        t = png_text(os.path.join(out, "images", "ok.png"))
        H.check("guidance" not in t, f"ok.png records no guidance ({sorted(t)})")
    else:
        H.check(False, f"the other request is done ({recs.get('ok')})")
    m2 = qwen_manifest(work, d, [{"id": "a", "prompt": "a red fox"}], defaults={"guidance": 7.5}, name="d")
    H.expect_config_error("Qwen-Image [defaults] guidance", ["run", m2],
                          "defaults.guidance: QwenImagePipeline does not use it", absent=LOADED)
    H.expect_config_error("Qwen-Image generate --guidance 7.5", gen(d, "--steps", "2", "--guidance", "7.5"),
                          "--guidance: QwenImagePipeline does not use it", absent=LOADED)
    f2 = H.init_model(work, "flux2-dev")
    m3 = qwen_manifest(work, f2, [{"id": "a", "prompt": "a red fox"}], defaults={"true_cfg_scale": 2.0}, name="f2")
    H.expect_config_error("FLUX.2 [dev] [defaults] true_cfg_scale", ["run", m3],
                          "defaults.true_cfg_scale: Flux2Pipeline does not use it", absent=LOADED)


def case_one_step(work):
    d = qwen(work)
    m = qwen_manifest(work, d, [{"id": "a", "prompt": "a red fox"}], defaults={"steps": 1}, name="d")
    H.expect_config_error("Qwen-Image [defaults] steps = 1", ["run", m],
                          "defaults.steps: 1 is fewer than QwenImagePipeline takes", absent=LOADED)
    rc, log = H.run(["run", m], np_=1, timeout=120)
    H.check("shift_terminal" in log and "scheduler_config.json" in log,
            "the message names the scheduler config and shift_terminal")
    H.expect_config_error("Qwen-Image generate --steps 1", gen(d, "--steps", "1"), "--steps: 1 is fewer than",
                          absent=LOADED)
    m2 = qwen_manifest(work, d, [{"id": "ok", "prompt": "a red fox"}, {"id": "one", "prompt": "a fox", "steps": 1}])
    rc, log = H.run(["run", m2], np_=1, timeout=300)
    recs = by_id(os.path.join(work, "job-out")) if os.path.exists(os.path.join(work, "job-out", "results.jsonl")) else {}
    one = recs.get("one", {})
    H.check(rc == 6 and one.get("status") == "failed" and "steps: 1 is fewer than" in one.get("error", "")
            and recs.get("ok", {}).get("status") == "done",
            f"a request with steps 1: exit {rc} (want 6), {one.get('status')}: {one.get('error', '')[:160]}; "
            f"the other {recs.get('ok', {}).get('status')}" + ("" if rc in (0, 6) else f"\n{log[-800:]}"))


def case_numeric_bounds(work):
    f = tiny_flux(H.tprun, os.path.join(work, "flux"))
    H.expect_config_error("generate --guidance 1e308", gen(f, "--guidance", "1e308"),
                          "--guidance: 1e+308 is outside [0, 1000]", absent=LOADED)
    H.expect_config_error("generate --true-cfg-scale 1e308", gen(f, "--true-cfg-scale", "1e308"),
                          "--true-cfg-scale: 1e+308 is outside [0, 1000]", absent=LOADED)
    H.expect_config_error("generate --height 9223372036854775792",
                          gen(f, size=("9223372036854775792", "16")),
                          "--height: 9223372036854775792 is outside [1, 16384]", absent=LOADED)
    req = jsonl(os.path.join(work, "r.jsonl"), [{"id": "a", "prompt": "a red fox"}])
    m = write_manifest(os.path.join(work, "j.toml"), f, req, os.path.join(work, "out"), parallel={"tp": 1})
    H.expect_config_error("run --set defaults.steps=1e400", ["run", m, "--set", "defaults.steps=1e400"],
                          "--set defaults.steps: 1e400 is a number outside [1, 10000]")


def case_scheduler_bounds(work):
    f = tiny_flux(H.tprun, os.path.join(work, "flux"))
    for key, value in (("base_shift", 1e308), ("max_shift", -1e308), ("shift", 1e308)):
        bad = os.path.join(work, f"bad_{key}")
        shutil.copytree(f, bad)
        path = os.path.join(bad, "scheduler", "scheduler_config.json")
        cfg = json.load(open(path))
        cfg[key] = value
        write(path, json.dumps(cfg))
        rc, log = H.run(gen(bad, "--steps", "1"), np_=2, timeout=120)
        want = f"scheduler_config.json: {key}"
        H.check(rc == 4 and log.count(want) >= 2 and "step 1/1" not in log,
                f"scheduler {key} {value}: exit {rc} (want 4), '{want}' on every rank, no step"
                + ("" if rc == 4 else f"\n{log[-600:]}"))


def case_nan_hint(work):
    import torch
    from safetensors.torch import load_file, save_file
    f = tiny_flux(H.tprun, os.path.join(work, "flux"))
    path = os.path.join(f, "transformer", "diffusion_pytorch_model.safetensors")
    w = load_file(path)
    w["proj_out.bias"] = torch.full_like(w["proj_out.bias"], float("nan"))
    save_file(w, path, metadata={"format": "pt"})
    rc, log = H.run(gen(f, "--steps", "1"), np_=1, timeout=120)
    H.check(rc == 6 and "NaN" in log and "fp32 is not the cause" in log and "try fp32" not in log,
            f"NaN weights at fp32: exit {rc} (want 6), the hint does not suggest fp32\n{log[-500:]}")


def case_frames_values(work):
    f = tiny_flux(H.tprun, os.path.join(work, "flux"))
    out = os.path.join(work, "bad-out")
    for value, want in (("0", "frames: 0 is outside [1, 4096]"), ("-2", "frames: -2 is outside [1, 4096]"),
                        ("99999999999", "frames: 99999999999 is outside [1, 4096]"),
                        ("1e30", "frames: must be an integer"), ("2.5", "frames: must be an integer, found 2.5"),
                        ('"9"', 'frames: must be an integer, found "9"')):
        req = write(os.path.join(work, "bad.jsonl"), '{"id": "a", "prompt": "a red fox", "frames": %s}\n' % value)
        m = write_manifest(os.path.join(work, "bad.toml"), f, req, out, parallel={"tp": 1})
        H.expect_config_error(f"a request's frames {value}", ["run", m], f"bad.jsonl:1: {want}", absent=LOADED)
    req = jsonl(os.path.join(work, "r.jsonl"), [{"id": "a", "prompt": "a red fox"}])
    m = write_manifest(os.path.join(work, "d.toml"), f, req, out, parallel={"tp": 1})
    H.expect_config_error("run --set defaults.frames=0", ["run", m, "--set", "defaults.frames=0"],
                          "--set defaults.frames: 0 is outside [1, 4096]", absent=LOADED)
    m = write_manifest(os.path.join(work, "d9.toml"), f, req, out, parallel={"tp": 1}, defaults={"frames": 9})
    H.expect_config_error("[defaults] frames = 9", ["run", m],
                          "defaults.frames: FluxPipeline makes images (one frame each), not frame sequences: 9 frames",
                          absent=LOADED)
    H.expect_config_error("generate --frames 9", gen(f, "--steps", "1", "--frames", "9"),
                          "--frames: FluxPipeline makes images", absent=LOADED)
    H.expect_config_error("generate --frames 0", gen(f, "--steps", "1", "--frames", "0"),
                          "--frames: 0 is outside [1, 4096]", absent=LOADED)
    rows = [{"id": "a", "prompt": "a red fox", "seed": 5}, {"id": "b", "prompt": "a red fox", "seed": 5, "frames": 1},
            {"id": "c", "prompt": "a red fox", "seed": 5, "frames": 9}]
    req = jsonl(os.path.join(work, "job.jsonl"), rows)
    job_out = os.path.join(work, "job-out")
    m = write_manifest(os.path.join(work, "job.toml"), f, req, job_out, parallel={"tp": 1}, defaults={"steps": 1})
    rc, log = H.run(["run", m], np_=1, timeout=300)
    recs = by_id(job_out) if os.path.exists(os.path.join(job_out, "results.jsonl")) else {}
    c = recs.get("c", {})
    H.check(rc == 6 and c.get("status") == "failed" and "frames: FluxPipeline makes images" in c.get("error", "")
            and c.get("frames") == 9,
            f"a request with frames 9: exit {rc} (want 6), recorded {c.get('status')} frames {c.get('frames')}: "
            f"{c.get('error', '')[:200]}" + ("" if rc in (0, 6) else f"\n{log[-800:]}"))
    H.check(not os.path.exists(os.path.join(job_out, "images", "c.png")), "no image for the refused request")
    if all(recs.get(k, {}).get("status") == "done" for k in "ab"):
        H.check(all("frames" not in recs[k] for k in "ab"), f"no frames in an image's record ({sorted(recs['b'])})")
        from PIL import Image
        pa, pb = (os.path.join(job_out, "images", f"{k}.png") for k in "ab")
        H.check(Image.open(pa).tobytes() == Image.open(pb).tobytes(), "frames 1 makes the same pixels as no frames")
        H.check("frames" not in png_text(pb), f"b.png records no frames ({sorted(png_text(pb))})")
    else:
        H.check(False, f"requests a and b are done ({recs.get('a')}, {recs.get('b')})")


def case_video_keys(work):
    f = tiny_flux(H.tprun, os.path.join(work, "flux"))
    out = os.path.join(work, "bad-out")
    for key, value, want in (("fps", "0", "fps: 0 is outside [1, 240]"), ("fps", "241", "fps: 241 is outside [1, 240]"),
                             ("fps", "2.5", "fps: must be an integer, found 2.5"),
                             ("guidance_2", "-1", "guidance_2: -1 is outside [0, 1000]"),
                             ("guidance_2", "1e9", "guidance_2: 1000000000 is outside [0, 1000]"),
                             ("guidance_2", '"x"', 'guidance_2: must be a number, found "x"')):
        req = write(os.path.join(work, "bad.jsonl"), '{"id": "a", "prompt": "a red fox", "%s": %s}\n' % (key, value))
        m = write_manifest(os.path.join(work, "bad.toml"), f, req, out, parallel={"tp": 1})
        H.expect_config_error(f"a request's {key} {value}", ["run", m], f"bad.jsonl:1: {want}", absent=LOADED)
    req = jsonl(os.path.join(work, "r.jsonl"), [{"id": "a", "prompt": "a red fox"}])
    m = write_manifest(os.path.join(work, "fps.toml"), f, req, out, parallel={"tp": 1}, defaults={"fps": 16})
    H.expect_config_error("[defaults] fps = 16", ["run", m],
                          "defaults.fps: FluxPipeline makes images, not videos", absent=LOADED)
    m = write_manifest(os.path.join(work, "g2.toml"), f, req, out, parallel={"tp": 1}, defaults={"guidance_2": 3.0})
    H.expect_config_error("[defaults] guidance_2 = 3", ["run", m],
                          "defaults.guidance_2: FluxPipeline has no second expert", absent=LOADED)
    for fmt in ("mp4", "frames"):
        m = write_manifest(os.path.join(work, f"{fmt}.toml"), f, req, out, parallel={"tp": 1},
                           tail=f'formats = ["{fmt}"]\n')
        H.expect_config_error(f"output.formats = [{fmt}]", ["run", m],
                              f"output.formats: {fmt} is for videos, and FluxPipeline makes images", absent=LOADED)
    H.expect_config_error("generate --fps 8", gen(f, "--steps", "1", "--fps", "8"),
                          "--fps: FluxPipeline makes images, not videos", absent=LOADED)
    H.expect_config_error("generate --fps 0", gen(f, "--steps", "1", "--fps", "0"),
                          "--fps: 0 is outside [1, 240]", absent=LOADED)
    H.expect_config_error("generate --guidance-2 3", gen(f, "--steps", "1", "--guidance-2", "3"),
                          "--guidance-2: FluxPipeline has no second expert", absent=LOADED)
    mp4 = gen(f, "--steps", "1")
    mp4[mp4.index("--out") + 1] = os.path.join(work, "g.mp4")
    H.expect_config_error("generate --out g.mp4", mp4, "an MP4 is a video, and FluxPipeline makes images",
                          absent=LOADED)
    H.check(not os.path.exists(os.path.join(work, "g.mp4")), "no g.mp4 written")
    rows = [{"id": "a", "prompt": "a red fox"}, {"id": "b", "prompt": "a red fox", "fps": 8},
            {"id": "c", "prompt": "a red fox", "guidance_2": 4.0}]
    req = jsonl(os.path.join(work, "job.jsonl"), rows)
    job_out = os.path.join(work, "job-out")
    m = write_manifest(os.path.join(work, "job.toml"), f, req, job_out, parallel={"tp": 1}, defaults={"steps": 1})
    rc, log = H.run(["run", m], np_=1, timeout=300)
    recs = by_id(job_out) if os.path.exists(os.path.join(job_out, "results.jsonl")) else {}
    for k, want in (("b", "fps: FluxPipeline makes images, not videos"),
                    ("c", "guidance_2: FluxPipeline has no second expert")):
        r = recs.get(k, {})
        H.check(r.get("status") == "failed" and want in r.get("error", "") and "fps" not in r,
                f"request {k}: recorded {r.get('status')} naming '{want}': {r.get('error', '')[:200]}"
                + ("" if rc in (0, 6) else f"\n{log[-800:]}"))
        H.check(not os.path.exists(os.path.join(job_out, "images", f"{k}.png")), f"no image for request {k}")
    a = recs.get("a", {})
    H.check(rc == 6 and a.get("status") == "done" and "fps" not in a and "frames" not in a,
            f"request a: exit {rc} (want 6), recorded {a.get('status')} without fps/frames ({sorted(a)})")
    if a.get("status") == "done":
        t = png_text(os.path.join(job_out, "images", "a.png"))
        H.check("fps" not in t and "guidance_2" not in t, f"a.png records neither fps nor guidance_2 ({sorted(t)})")


def main():
    global H
    H = Harness(sys.argv[1], sys.argv[2])
    return run_cases(H, {"max_sequence_length": case_max_sequence_length, "unused_options": case_unused_options,
                         "one_step": case_one_step, "numeric_bounds": case_numeric_bounds,
                         "scheduler_bounds": case_scheduler_bounds, "nan_hint": case_nan_hint,
                         "frames_values": case_frames_values, "video_keys": case_video_keys},
                     "tprun-hostile-requests")


if __name__ == "__main__":
    sys.exit(main())
