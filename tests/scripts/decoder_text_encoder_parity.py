#!/usr/bin/env python3
"""Parity of tprun's decoder-only text encoders (FLUX.2's Qwen3ForCausalLM and
Mistral3ForConditionalGeneration) with the real transformers classes.

Every model is transformers' own class, built at test time with EVERY parameter redrawn from a
seeded generator (weights with ndim >= 2 ~ N(0, clamp(1/sqrt(fan_in), 0.02, 0.2)), norm weights
~ N(1, 0.1), biases ~ N(0, 0.1)), saved with save_pretrained and loaded back with from_pretrained
(transformers' default sdpa attention, as the diffusers pipelines load them; eager is reported
beside it). Inputs as the FLUX.2 pipelines pass them: input_ids and a padded attention_mask (prompts
of different lengths, pad id 0; right padding, plus one left-padded row, where a query that sees no
key gets 0 under sdpa and the average of every value under eager),
output_hidden_states=True, use_cache=False.

Cases (one ctest entry each; `decoder_text_encoder_parity.py TPRUN MPIRUN UNIT_TESTS [CASE ...]`):
  table       `tprun inspect --json --tp 2` on each saved folder: the same names and shapes as the
              safetensors file (vision tower, projector, lm_head included, none "(not in model)"),
              each style and plan_key from transformers' base_model_tp_plan (prefixed as saved).
  forward     fp32 `tprun forward` (every layer: last_hidden_state = hidden_states[-1], after the
              final norm) within 1e-4 of transformers at tp 1, 2, 4: Qwen3 (8 heads, 4 KV heads,
              head_dim 16 != hidden / heads, tied lm_head), Qwen3 with attention_bias, an untied
              lm_head and sliding-window layers (window 5), Mistral3 (small Pixtral tower).
  rope        rope_type yarn (Qwen3, legacy rope_scaling form), llama3 and linear (Mistral3) at tp 1, 2.
  hidden      ModelOptions::hidden_layers through the unit-test binary's probe (`tprun forward` has
              no flag for it yet): hidden_states.<k> and prompt_embeds (the pipelines' stack /
              permute / reshape) within 1e-4 at tp 1, 2, 4; bytes read by each rank equal exactly
              the embeddings plus the layers up to the last one asked for (the final norm only with
              k = num_layers); a checkpoint with those later layers and the final norm DELETED loads
              and gives the same output (and refuses a full load, naming the missing tensor).
  bf16        `tprun forward --dtype bf16` against transformers from_pretrained(dtype=bfloat16)
              (what the pipelines do: the RoPE inv_freq stays fp32) at tp 1, 2, 4, within BF16_TOL.
  layout      Mistral3 in both name layouts (save_pretrained's language_model.model.* and the
              module names model.language_model.*): transformers loads both, tprun gives the same
              output for both; bytes read at tp 1 = the language model's bytes exactly (vision
              tower, projector and lm_head never read).
  allreduce   `tprun verify --model DIR --tp 2` passes and prints "all_reduce calls per forward: N
              (plan: N)" with N = 2 x layers (Qwen3, Mistral3).
  validation  8 heads and 2 KV heads at tp 4: refused on every rank before any byte, exit 3, with
              "tp 4 does not divide num_key_value_heads 2"; no hang.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig,  # noqa: E402
                          Qwen3Config, Qwen3ForCausalLM)

FP32_TOL = 1e-4
# bf16 against transformers' bf16 (from_pretrained(dtype=bfloat16), sdpa), last_hidden_state of
# the 4-layer configs here (max|ref| 3..4.6, where one bf16 ulp is 0.016..0.031): 0 at tp 1 (the
# same bf16 ops in the same order); at tp 2 and 4 the row-wise partial sums round to bf16 before
# the reduce, which measured 0.039..0.080 over seeds 40, 41 and 100..105 (mean 0.007..0.009) --
# the size of transformers' own bf16-vs-fp32 error on the same models (0.054..0.086). About 2x
# the largest difference measured:
BF16_TOL = 0.15

QWEN = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"})
QWEN_BIAS = dict(QWEN, attention_bias=True, tie_word_embeddings=False, use_sliding_window=True, sliding_window=5,
                 max_window_layers=2)
MISTRAL_TEXT = dict(model_type="mistral", vocab_size=256, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                    rms_norm_eps=1e-5, sliding_window=None, rope_theta=1e9)
PIXTRAL = dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=2, head_dim=16, patch_size=4, image_size=16, num_channels=3)
MISTRAL3 = dict(text_config=MISTRAL_TEXT, vision_config=PIXTRAL, tie_word_embeddings=False)

TPRUN = MPIRUN = UNIT = None
FAILURES = []


def check(ok, msg):
    print(f"{'ok  ' if ok else 'FAIL'} {msg}", flush=True)
    if not ok:
        FAILURES.append(msg)
    return ok


# ---------------------------------------------------------------------------------------------
# models, inputs, runs


def build(kind, cfg, seed):
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**cfg))
    else:
        c = dict(cfg)
        model = Mistral3ForConditionalGeneration(Mistral3Config(**c))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * min(max(1.0 / math.sqrt(fan_in), 0.02), 0.2))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:  # RMSNorm weights (input/post-attention, q/k norms, final norm, Pixtral norms)
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def make_inputs(vocab, lengths, seq, seed):
    """A padded batch as the pipelines' tokenizers make it (padding="max_length", pad id 0): right
    padding for every length, and the first length once more padded on the left (a tokenizer whose
    padding_side is "left")."""
    g = torch.Generator().manual_seed(seed + 1000)
    rows = len(lengths) + 1
    ids = torch.randint(1, vocab, (rows, seq), generator=g)
    mask = torch.zeros(rows, seq, dtype=torch.int64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = 0
    n = lengths[0]
    mask[-1, seq - n:] = 1
    ids[-1, :seq - n] = 0
    return {"input_ids": ids.contiguous(), "attention_mask": mask}


def reference(model_dir, kind, inputs, dtype=torch.float32, attn="sdpa"):
    cls = Qwen3ForCausalLM if kind == "qwen3" else Mistral3ForConditionalGeneration
    model = cls.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn).eval()
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], output_hidden_states=True,
                    use_cache=False)
    return [h.float() for h in out.hidden_states]


def mpirun(np_, *args, timeout=180):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(np_), TPRUN, *args, "--log-dir", ""]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s (hang?)"
    return r.returncode, r.stdout + r.stderr


def tprun_forward(model_dir, inputs_path, out_path, tp, dtype="fp32"):
    """last_hidden_state and the bytes rank 0 read, or (None, error)."""
    rc, out = mpirun(tp, "forward", "--model", model_dir, "--inputs", inputs_path, "--out", out_path, "--tp", str(tp),
                     "--dtype", dtype)
    if rc != 0:
        return None, f"exit {rc}: {(out or '')[-2000:]}"
    m = re.search(r"\((\d+) bytes this rank\)", out)
    return (load_file(out_path)["last_hidden_state"].float(), int(m.group(1)) if m else -1), None


def probe(model_dir, inputs_path, out_path, tp, layers, dtype="fp32", timeout=180):
    """The unit-test binary's DecoderTextEncoderProbe: outputs and per-rank reports, or (None, error)."""
    env = {"TPRUN_DTE_PROBE_MODEL": model_dir, "TPRUN_DTE_PROBE_INPUTS": inputs_path,
           "TPRUN_DTE_PROBE_OUT": out_path, "TPRUN_DTE_PROBE_LAYERS": ",".join(map(str, layers)),
           "TPRUN_DTE_PROBE_DTYPE": dtype}
    cmd = [MPIRUN, "--oversubscribe", "-np", str(tp)]
    for k in env:
        cmd += ["-x", k]
    cmd += [UNIT, "--gtest_filter=DecoderTextEncoderProbe.*", "--gtest_brief=1"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s (hang?)"
    text = r.stdout + r.stderr
    if r.returncode != 0 or "SKIPPED" in text or not os.path.exists(out_path):
        return None, f"exit {r.returncode}: {text[-2000:]}"
    reports = [json.load(open(f"{out_path}.rank{i}.json")) for i in range(tp)]
    return (load_file(out_path), reports), None


def compare(label, got, expected, tol):
    if got.shape != expected.shape:
        return check(False, f"{label}: shape {list(got.shape)} vs transformers {list(expected.shape)}")
    diff = (got - expected).abs()
    dmax = diff.max().item()
    check(math.isfinite(dmax) and dmax <= tol,
          f"{label}: max abs diff {dmax:.3g}, mean {diff.mean().item():.3g} (tolerance {tol:.3g}; "
          f"max|ref| {expected.abs().max().item():.3g})")
    return dmax


def stacked(states, layers):
    """The FLUX.2 pipelines' prompt_embeds from hidden_states."""
    out = torch.stack([states[k] for k in layers], dim=1)
    b, n, s, h = out.shape
    return out.permute(0, 2, 1, 3).reshape(b, s, n * h)


def shapes_of(model_dir):
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def expected_bytes(shapes, prefix, run, final_norm, tp, elem=4):
    """What a rank reads: the embeddings, layers [0, run) (colwise / rowwise weights 1/tp, the rest
    whole), the final norm when asked for; nothing of the vision tower, projector or lm_head."""
    total = 0
    for name, shape in shapes.items():
        n = math.prod(shape) * elem
        if name == prefix + "embed_tokens.weight":
            total += n
        elif name == prefix + "norm.weight":
            total += n if final_norm else 0
        elif name.startswith(prefix + "layers."):
            if int(name[len(prefix + "layers."):].split(".")[0]) >= run:
                continue
            sharded = re.search(r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$|"
                                r"(o_proj|down_proj)\.weight$", name)
            total += n // tp if sharded else n
    return total


class Work:
    """A model saved in a temporary folder with its inputs and transformers' hidden states."""

    def __init__(self, name, kind, cfg, seed, lengths=(12, 7, 3), seq=12, prefix=None, edit_config=None):
        self.name, self.kind, self.cfg = name, kind, cfg
        self.dir = tempfile.mkdtemp(prefix=f"tprun_dte_{name}_")
        self.model_dir = os.path.join(self.dir, "model")
        build(kind, cfg, seed).save_pretrained(self.model_dir)
        if edit_config:  # e.g. an older config.json form; transformers' reference reads it too
            path = os.path.join(self.model_dir, "config.json")
            c = json.load(open(path))
            edit_config(c)
            json.dump(c, open(path, "w"), indent=2)
        text = cfg if kind == "qwen3" else cfg["text_config"]
        self.layers = text["num_hidden_layers"]
        self.prefix = prefix or ("model." if kind == "qwen3" else "language_model.model.")
        self.inputs = make_inputs(text["vocab_size"], lengths, seq, seed)
        self.inputs_path = os.path.join(self.dir, "inputs.safetensors")
        save_file(self.inputs, self.inputs_path)
        self.states = reference(self.model_dir, kind, self.inputs)
        assert len(self.states) == self.layers + 1

    def out(self, tag):
        return os.path.join(self.dir, f"out_{tag}.safetensors")

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# cases


def tp_plan_of(kind):
    cfg_cls = Qwen3Config if kind == "qwen3" else MistralConfig
    return cfg_cls.base_model_tp_plan


def case_table():
    for name, kind, cfg in (("qwen3", "qwen3", QWEN), ("qwen3_bias", "qwen3", QWEN_BIAS),
                            ("mistral3", "mistral3", MISTRAL3)):
        d = tempfile.mkdtemp(prefix=f"tprun_dte_table_{name}_")
        try:
            build(kind, cfg, 1).save_pretrained(d)
            r = subprocess.run([TPRUN, "inspect", d, "--json", "--tp", "2"], capture_output=True, text=True,
                               timeout=120)
            if not check(r.returncode == 0, f"table {name}: tprun inspect exit {r.returncode} {r.stderr[-500:]}"):
                continue
            comp = json.loads(r.stdout)["components"][0]
            ours = {t["name"]: t for t in comp["tensors"]}
            theirs = shapes_of(d)
            check(set(ours) == set(theirs) and not any(t["plan"] == "(not in model)" for t in ours.values()),
                  f"table {name}: {len(theirs)} saved tensors all known to tprun "
                  f"({[n for n, t in ours.items() if t['plan'] == '(not in model)'][:4]})")
            prefix = "model." if kind == "qwen3" else "language_model.model."
            plan = {prefix + k: v for k, v in tp_plan_of(kind).items()}
            bad = []
            for tname, shape in theirs.items():
                t = ours.get(tname)
                module = tname.rsplit(".", 1)[0]
                key = re.sub(r"\.layers\.\d+\.", ".layers.*.", module)
                style = plan.get(key, "replicated")
                want_key = key if style in ("colwise", "rowwise") else None  # tprun keys split modules only
                if style == "replicated_with_grad_allreduce":
                    style = "replicated"
                if tname.endswith(".bias") and style == "rowwise":
                    style = "replicated"  # the row-wise bias: whole on every rank, added once after the reduce
                if t is None or t["shape"] != shape or t["plan"] != style or t.get("plan_key") != want_key:
                    bad.append(f"{tname}: tprun {t and (t['shape'], t['plan'], t.get('plan_key'))}, "
                               f"transformers {shape} {style} {want_key}")
            check(not bad, f"table {name}: shapes, styles and plan keys as base_model_tp_plan {bad[:3]}")
            check(comp["tp"]["valid"], f"table {name}: tp 2 valid ({comp['tp'].get('error', '')})")
        finally:
            shutil.rmtree(d, ignore_errors=True)


def case_forward():
    for i, (name, kind, cfg, tps) in enumerate((("qwen3", "qwen3", QWEN, (1, 2, 4)),
                                                ("qwen3_bias_sliding", "qwen3", QWEN_BIAS, (1, 2, 4)),
                                                ("mistral3", "mistral3", MISTRAL3, (1, 2, 4)))):
        w = Work(name, kind, cfg, seed=10 + i)
        try:
            # sdpa differs from eager only where a query sees no key (left padding, a sliding window
            # over padding): eager averages every value there, torch's sdpa returns 0. tprun follows
            # sdpa, transformers' default and what the pipelines run.
            eager = reference(w.model_dir, kind, w.inputs, attn="eager")[-1]
            print(f"     ({name}: transformers sdpa vs eager {(eager - w.states[-1]).abs().max().item():.3g})")
            for tp in tps:
                res, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
                if not check(err is None, f"forward {name} tp {tp}: {err}"):
                    continue
                compare(f"forward {name} tp {tp} last_hidden_state", res[0], w.states[-1], FP32_TOL)
        finally:
            w.close()


def case_rope():
    yarn = dict(QWEN)
    del yarn["rope_parameters"]
    yarn.update(rope_theta=10000.0, rope_scaling={"type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 8})
    llama3 = dict(MISTRAL3, text_config=dict(MISTRAL_TEXT, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}))
    linear = dict(MISTRAL3, text_config=dict(MISTRAL_TEXT, rope_scaling={"rope_type": "linear", "factor": 3.0}))
    def legacy_form(c):  # transformers 4.x's config.json: rope_theta and rope_scaling at the top
        p = c.pop("rope_parameters")
        c["rope_theta"] = p.pop("rope_theta")
        p["type"] = p.pop("rope_type")
        c["rope_scaling"] = p

    for i, (name, kind, cfg, edit) in enumerate((("yarn", "qwen3", yarn, legacy_form),
                                                 ("llama3", "mistral3", llama3, None),
                                                 ("linear", "mistral3", linear, None))):
        w = Work(f"rope_{name}", kind, cfg, seed=20 + i, lengths=(12, 9), seq=12, edit_config=edit)
        try:
            rope = json.load(open(os.path.join(w.model_dir, "config.json")))
            rope = rope.get("rope_scaling") or rope.get("rope_parameters") or rope["text_config"]["rope_parameters"]
            for tp in (1, 2):
                res, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"tp{tp}"), tp)
                if check(err is None, f"rope {name} tp {tp}: {err}"):
                    compare(f"rope {name} ({rope}) tp {tp}", res[0], w.states[-1], FP32_TOL)
        finally:
            w.close()


def case_hidden():
    w = Work("hidden", "qwen3", QWEN, seed=30)
    m = Work("hidden_m3", "mistral3", MISTRAL3, seed=31)
    try:
        runs = [(w, (1, 3), (1, 2, 4)), (w, (0, 2, 4), (1, 2)), (w, (), (2,)), (m, (2, 1), (1, 2))]
        for work, layers, tps in runs:
            for tp in tps:
                label = f"hidden {work.name} layers {list(layers) or 'none'} tp {tp}"
                res, err = probe(work.model_dir, work.inputs_path, work.out(f"probe_{tp}"), tp, layers)
                if not check(err is None, f"{label}: {err}"):
                    continue
                outs, reports = res
                if layers:
                    for k in layers:
                        compare(f"{label} hidden_states.{k}", outs[f"hidden_states.{k}"], work.states[k], FP32_TOL)
                    compare(f"{label} prompt_embeds", outs["prompt_embeds"], stacked(work.states, layers), FP32_TOL)
                else:
                    compare(f"{label} last_hidden_state", outs["last_hidden_state"], work.states[-1], FP32_TOL)
                run = max(layers) if layers else work.layers
                want = expected_bytes(shapes_of(work.model_dir), work.prefix, run, run == work.layers, tp)
                got = [r["bytes_loaded"] for r in reports]
                check(all(b == want for b in got) and all(r["layers_run"] == run for r in reports),
                      f"{label}: bytes read per rank {got} == embeddings + layers [0, {run}) "
                      f"{'+ final norm ' if run == work.layers else ''}= {want} "
                      f"(file {sum(math.prod(s) * 4 for s in shapes_of(work.model_dir).values())})")
                plan = 0 if tp == 1 else 2 * run
                check(all(r["all_reduces"] == r["planned"] == plan for r in reports),
                      f"{label}: AllReduces {[r['all_reduces'] for r in reports]} == plan {plan}")
        # Later layers and the final norm deleted from the checkpoint: still loads for layers (1, 3).
        cut = os.path.join(w.dir, "cut")
        shutil.copytree(w.model_dir, cut)
        state = load_file(os.path.join(cut, "model.safetensors"))
        dropped = [k for k in state if k.startswith("model.layers.3.") or k == "model.norm.weight"]
        for k in dropped:
            del state[k]
        save_file(state, os.path.join(cut, "model.safetensors"), metadata={"format": "pt"})
        for tp in (1, 2):
            res, err = probe(cut, w.inputs_path, w.out(f"cut_{tp}"), tp, (1, 3))
            if check(err is None, f"hidden cut checkpoint ({len(dropped)} tensors of layer 3 + model.norm deleted) "
                                  f"loads for layers [1, 3] at tp {tp}: {err}"):
                compare(f"hidden cut tp {tp} prompt_embeds", res[0]["prompt_embeds"], stacked(w.states, (1, 3)),
                        FP32_TOL)
        rc, out = mpirun(1, "forward", "--model", cut, "--inputs", w.inputs_path, "--out", w.out("cut_full"))
        # Named by the config check against the checkpoint's blocks ("num_hidden_layers is 4 but ...
        # holds 3 such blocks 'model.layers.<i>'").
        said = [ln for ln in (out or "").splitlines() if "num_hidden_layers" in ln and "model.layers" in ln]
        check(rc == 4 and said, f"hidden cut checkpoint refuses a full load: exit {rc}, {said[:1]}")
    finally:
        w.close()
        m.close()


def case_bf16():
    worst = {}
    for i, (name, kind, cfg) in enumerate((("qwen3", "qwen3", QWEN), ("mistral3", "mistral3", MISTRAL3))):
        w = Work(f"bf16_{name}", kind, cfg, seed=40 + i)
        try:
            ref = reference(w.model_dir, kind, w.inputs, dtype=torch.bfloat16)[-1]
            eager = reference(w.model_dir, kind, w.inputs, dtype=torch.bfloat16, attn="eager")[-1]
            print(f"     ({name}: transformers bf16 sdpa vs eager {(eager - ref).abs().max().item():.3g}, "
                  f"bf16 sdpa vs fp32 {(ref - w.states[-1]).abs().max().item():.3g})")
            for tp in (1, 2, 4):
                res, err = tprun_forward(w.model_dir, w.inputs_path, w.out(f"bf16_tp{tp}"), tp, dtype="bf16")
                if check(err is None, f"bf16 {name} tp {tp}: {err}"):
                    worst[(name, tp)] = compare(f"bf16 {name} tp {tp} last_hidden_state", res[0], ref, BF16_TOL)
        finally:
            w.close()
    print(f"     bf16 max abs diffs: {', '.join(f'{n} tp {t}: {d:.3g}' for (n, t), d in worst.items())}")


RENAMES = (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
           ("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector."))


def case_layout():
    w = Work("layout", "mistral3", MISTRAL3, seed=50)
    try:
        shapes = shapes_of(w.model_dir)
        check(any(k.startswith("vision_tower.") for k in shapes) and "language_model.lm_head.weight" in shapes,
              f"layout: save_pretrained wrote the saved layout with the vision tower and lm_head "
              f"({sorted(shapes)[:2]} ...)")
        nested = os.path.join(w.dir, "in_memory")
        shutil.copytree(w.model_dir, nested)
        state = load_file(os.path.join(nested, "model.safetensors"))
        renamed = {}
        for k, v in state.items():
            for a, b in RENAMES:
                if k.startswith(a):
                    k = b + k[len(a):]
                    break
            renamed[k] = v
        save_file(renamed, os.path.join(nested, "model.safetensors"), metadata={"format": "pt"})
        ref_nested = reference(nested, "mistral3", w.inputs)[-1]
        check(torch.equal(ref_nested, w.states[-1]), "layout: transformers loads the module-name layout alike")
        outs = {}
        for tag, d, prefix in (("saved", w.model_dir, "language_model.model."),
                               ("in_memory", nested, "model.language_model.")):
            res, err = tprun_forward(d, w.inputs_path, w.out(tag), 1)
            if not check(err is None, f"layout {tag}: {err}"):
                continue
            outs[tag] = res[0]
            compare(f"layout {tag} tp 1", res[0], w.states[-1], FP32_TOL)
            lm = expected_bytes(shapes_of(d), prefix, w.layers, True, 1)
            total = sum(math.prod(s) * 4 for s in shapes.values())
            check(res[1] == lm, f"layout {tag}: bytes read {res[1]} == language model {lm} "
                                f"(file {total}: vision tower, projector, lm_head never read)")
        if len(outs) == 2:
            check(torch.equal(outs["saved"], outs["in_memory"]), "layout: both layouts give the same output bitwise")
    finally:
        w.close()


def case_allreduce():
    for i, (name, kind, cfg) in enumerate((("qwen3", "qwen3", QWEN), ("mistral3", "mistral3", MISTRAL3))):
        w = Work(f"allreduce_{name}", kind, cfg, seed=60 + i)
        try:
            rc, out = mpirun(2, "verify", "--model", w.model_dir, "--tp", "2")
            m = re.search(r"all_reduce calls per forward: (\d+) \(plan: (\d+)\)", out or "")
            if not check(rc == 0 and m is not None, f"allreduce {name} verify tp 2: exit {rc}; "
                                                    f"{(out or '')[-1500:] if rc else ''}"):
                continue
            n, p = int(m.group(1)), int(m.group(2))
            ok = re.search(r"OK: max abs diff (\S+)", out)
            check(n == p == 2 * w.layers, f"allreduce {name}: {n} AllReduces per forward (plan {p}; expected "
                                          f"2 x {w.layers} layers) ({ok.group(0) if ok else ''})")
        finally:
            w.close()


def case_validation():
    cfg = dict(QWEN, num_key_value_heads=2, num_hidden_layers=1)
    w = Work("validation", "qwen3", cfg, seed=70)
    try:
        rc, out = mpirun(4, "forward", "--model", w.model_dir, "--inputs", w.inputs_path, "--out", w.out("never"),
                         "--tp", "4", timeout=90)
        if not check(rc is not None, f"validation: {out}"):
            return
        lines = [ln for ln in out.splitlines() if "tp 4 does not divide num_key_value_heads 2" in ln]
        ranks = {mm.group(1) for ln in lines for mm in [re.search(r"\[r(\d+)/", ln)] if mm}
        check(rc == 3 and len(ranks) == 4 and "bytes this rank" not in out and not os.path.exists(w.out("never")),
              f"validation tp 4 vs 2 KV heads: exit {rc}, message on ranks {sorted(ranks)} of 4: "
              f"{lines[0].strip() if lines else out[-800:]}")
    finally:
        w.close()


CASES = {"table": case_table, "forward": case_forward, "rope": case_rope, "hidden": case_hidden, "bf16": case_bf16,
         "layout": case_layout, "allreduce": case_allreduce, "validation": case_validation}


def run_main(cases):
    """`SCRIPT TPRUN MPIRUN UNIT_TESTS [CASE ...]` of the text encoder parity scripts (this one,
    qwen2_5_vl_parity.py, umt5_parity.py): sets TPRUN / MPIRUN / UNIT, runs the named cases of `cases`
    (name -> function; all when none are named), timing each, and returns the exit status (1 when any
    check() failed)."""
    global TPRUN, MPIRUN, UNIT
    TPRUN, MPIRUN, UNIT = sys.argv[1], sys.argv[2], sys.argv[3]
    names = sys.argv[4:] or list(cases)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    t_start = time.time()
    for name in names:
        t0 = time.time()
        cases[name]()
        print(f"  [{name}] {time.time() - t0:.1f}s", flush=True)
    print(f"{'FAILED' if FAILURES else 'OK'}: {len(FAILURES)} failures ({time.time() - t_start:.1f}s)")
    return 1 if FAILURES else 0


def main():
    return run_main(CASES)


if __name__ == "__main__":
    sys.exit(main())
