#!/usr/bin/env python3
"""Parity of tprun's decoder-only text encoder with the language model of transformers'
Qwen2_5_VLForConditionalGeneration (Qwen-Image's text encoder, Qwen2.5-VL-7B: 28 layers x 3584).

The model is transformers' own class, built at test time with EVERY parameter redrawn from a
seeded generator (as decoder_text_encoder_parity.py does: weights ~ N(0, clamp(1/sqrt(fan_in),
0.02, 0.2)), norm weights ~ N(1, 0.1), biases ~ N(0, 0.1)), vision tower included, saved with
save_pretrained and loaded back with from_pretrained (default sdpa attention). Tiny config: 3
layers, hidden 128, 8 heads / 4 KV heads (head_dim 16), mrope_section [2, 3, 3] (Qwen2.5-VL's
[16, 24, 24] scaled to head_dim / 2 = 8), q/k/v biases. Inputs as QwenImagePipeline passes them:
input_ids + attention_mask, output_hidden_states=True, and the pipeline takes hidden_states[-1];
a batch of 2 with the first row right-padded and the second left-padded (pad id 0).

Cases (one ctest entry each; `qwen2_5_vl_parity.py TPRUN MPIRUN UNIT_TESTS [CASE ...]`):
  table      `tprun inspect --json --tp 2` on the nested (transformers 5) and flat (4.x) folders:
             every saved tensor known with its shape (visual.*, lm_head included), styles and
             plan keys as Qwen2_5_VLTextConfig.base_model_tp_plan (prefixed "model.").
  forward    fp32 `tprun forward` (last_hidden_state = hidden_states[-1]) within 1e-4 of
             transformers at tp 1, 2, 4 on the folder save_pretrained writes (nested config).
  flat       the hub's transformers 4.x config.json form (text fields at the top level,
             rope_scaling {"type": "mrope", "mrope_section": ...}, rope_theta, vision_config):
             transformers gives the same output as for the nested form; tprun within 1e-4 at tp 1, 2, 4.
             A file with both (text_config and disagreeing top-level fields): text_config wins in
             transformers and in tprun (tp 1).
  layout     the module-name layout (model.language_model.*, model.visual.*, lm_head): transformers
             loads it alike; tprun's output bitwise the same as for the saved layout at tp 1 and 2;
             bytes read by rank 0 = exactly the language model's bytes (no visual.*, no lm_head) in
             both layouts, at tp 1 and 2.
  rope       what transformers does with a text-only padded batch: get_rope_index is never called,
             rope_deltas stays None, the rotary embedding gets position_ids arange(S) for all 3
             rows and every batch row (padding ignored), and its cos / sin equal plain RoPE over
             those positions bitwise; plus a sliding-window config (use_sliding_window, window 5
             from layer 1 on) at tp 1 and 2 within 1e-4.
  hidden     hidden_layers through the unit binary's probe: hidden_states.<k> within 1e-4, bytes
             read per rank = embeddings + the layers up to the cut (+ final norm for k = 3),
             AllReduces = plan; transformers' hidden_states[-1] is last_hidden_state, i.e. AFTER
             the final norm (the last layer's raw output normed by model.norm).
  bf16       `tprun forward --dtype bf16` vs transformers from_pretrained(dtype=bfloat16) at tp 1, 2, 4
             within BF16_TOL.
  allreduce  `tprun verify --tp 2` passes and counts 2 x layers AllReduces per forward.
  refusals   before any weight byte, on every rank, one error naming config.json and the key:
             mrope_section summing to 9 != head_dim / 2 (flat and nested forms), mrope_section
             of 2 entries, mrope_section absent (the default [16, 24, 24] sums to 64, not 8),
             hidden_size not a multiple of num_attention_heads (exit 4: checkpoint error, the kind
             every config.json check of this parser raises); tp 4 with 2 KV heads (exit 3, config
             error "tp 4 does not divide num_key_value_heads 2"); no hang.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qmod  # noqa: E402

import decoder_text_encoder_parity as dte  # noqa: E402  (shared runners and checks)

FP32_TOL = dte.FP32_TOL
# bf16 against transformers' bf16 (sdpa), last_hidden_state, max|ref| ~4: one bf16 ulp there is
# 0.016-0.031. tp 1 runs the same bf16 ops in the same order; at tp 2 / 4 the row-wise partial sums
# round to bf16 before the reduce. Measured max abs diffs are printed; the bound is that of the
# Qwen3 / Mistral3 encoders (about 2x the largest difference measured on those):
BF16_TOL = dte.BF16_TOL

TEXT = dict(vocab_size=256, hidden_size=128, intermediate_size=192, num_hidden_layers=3, num_attention_heads=8,
            num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]})
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=128, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, fullatt_block_indexes=[1])
PREFIX = "model."            # the language model in the saved layout
IN_MEMORY = "model.language_model."


def build(text, seed):
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=VISION))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * min(max(1.0 / math.sqrt(fan_in), 0.02), 0.2))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:  # RMSNorm weights
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def make_inputs(vocab, seq, seed, right=9, left=6):
    """Batch of 2: row 0 right-padded to `right` tokens, row 1 left-padded to `left` tokens."""
    g = torch.Generator().manual_seed(seed + 1000)
    ids = torch.randint(1, vocab, (2, seq), generator=g)
    mask = torch.zeros(2, seq, dtype=torch.int64)
    mask[0, :right] = 1
    ids[0, right:] = 0
    mask[1, seq - left:] = 1
    ids[1, :seq - left] = 0
    return {"input_ids": ids.contiguous(), "attention_mask": mask}


def reference(model_dir, inputs, dtype=torch.float32, attn="sdpa", model_out=None):
    """hidden_states as QwenImagePipeline asks for them (input_ids, attention_mask, output_hidden_states)."""
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn).eval()
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], output_hidden_states=True)
    if model_out is not None:
        model_out.append((model, out))
    return [h.float() for h in out.hidden_states]


def flat_form(c):
    """transformers 4.x's config.json (the hub's Qwen2.5-VL / Qwen-Image text_encoder files): the text
    fields at the top level, rope_theta and rope_scaling {"type": "mrope", "mrope_section"} there."""
    t = c.pop("text_config")
    rope = t.pop("rope_parameters")
    t.pop("layer_types", None)
    t.pop("model_type", None)
    c.update(t)
    c["rope_theta"] = rope["rope_theta"]
    c["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}


class Work:
    """A Qwen2.5-VL saved in a temporary folder with its inputs and transformers' hidden states."""

    def __init__(self, name, seed, text=TEXT, edit_config=None, seq=12, reference_states=True):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"tprun_qwen25vl_{name}_")
        self.model_dir = os.path.join(self.dir, "model")
        build(text, seed).save_pretrained(self.model_dir)
        if edit_config:
            path = os.path.join(self.model_dir, "config.json")
            c = json.load(open(path))
            edit_config(c)
            json.dump(c, open(path, "w"), indent=2)
        self.layers = text["num_hidden_layers"]
        self.inputs = make_inputs(text["vocab_size"], seq, seed)
        self.inputs_path = os.path.join(self.dir, "inputs.safetensors")
        save_file(self.inputs, self.inputs_path)
        self.states = reference(self.model_dir, self.inputs) if reference_states else None
        if self.states is not None:
            assert len(self.states) == self.layers + 1

    def out(self, tag):
        return os.path.join(self.dir, f"out_{tag}.safetensors")

    def in_memory_copy(self):
        """The same weights under the module names (model.language_model.*, model.visual.*, lm_head)."""
        d = os.path.join(self.dir, "in_memory")
        shutil.copytree(self.model_dir, d)
        state = load_file(os.path.join(d, "model.safetensors"))
        renamed = {}
        for k, v in state.items():
            if k.startswith("visual."):
                k = "model." + k
            elif k.startswith(PREFIX):
                k = IN_MEMORY + k[len(PREFIX):]
            renamed[k] = v
        save_file(renamed, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return d

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def forward_at(w, model_dir, tps, label, states=None, dtype="fp32", tol=FP32_TOL):
    results = {}
    for tp in tps:
        res, err = dte.tprun_forward(model_dir, w.inputs_path, w.out(f"{label}_{dtype}_tp{tp}"), tp, dtype=dtype)
        if not dte.check(err is None, f"{label} tp {tp}: {err}"):
            continue
        results[tp] = res
        dte.compare(f"{label} {dtype} tp {tp} last_hidden_state", res[0], (states or w.states)[-1], tol)
    return results


# ---------------------------------------------------------------------------------------------
# cases


def case_table():
    from transformers import Qwen2_5_VLTextConfig
    plan = {PREFIX + k: v for k, v in Qwen2_5_VLTextConfig.base_model_tp_plan.items()}
    w = Work("table", 1, reference_states=False)
    try:
        flat = os.path.join(w.dir, "flat")
        shutil.copytree(w.model_dir, flat)
        c = json.load(open(os.path.join(flat, "config.json")))
        flat_form(c)
        json.dump(c, open(os.path.join(flat, "config.json"), "w"))
        for form, d in (("nested", w.model_dir), ("flat", flat)):
            r = subprocess.run([dte.TPRUN, "inspect", d, "--json", "--tp", "2"], capture_output=True, text=True,
                               timeout=120)
            if not dte.check(r.returncode == 0, f"table {form}: tprun inspect exit {r.returncode} {r.stderr[-500:]}"):
                continue
            comp = json.loads(r.stdout)["components"][0]
            ours = {t["name"]: t for t in comp["tensors"]}
            theirs = dte.shapes_of(d)
            unknown = [n for n, t in ours.items() if t["plan"] == "(not in model)"]
            dte.check(set(ours) == set(theirs) and not unknown and any(k.startswith("visual.") for k in theirs)
                      and "lm_head.weight" in theirs,
                      f"table {form}: {len(theirs)} saved tensors (visual.*, lm_head included) all known "
                      f"({unknown[:4]})")
            bad = []
            for name, shape in theirs.items():
                t = ours.get(name)
                key = re.sub(r"\.layers\.\d+\.", ".layers.*.", name.rsplit(".", 1)[0])
                style = plan.get(key, "replicated")
                want_key = key if style in ("colwise", "rowwise") else None
                if t is None or t["shape"] != shape or t["plan"] != style or t.get("plan_key") != want_key:
                    bad.append(f"{name}: tprun {t and (t['shape'], t['plan'], t.get('plan_key'))}, "
                               f"transformers {shape} {style} {want_key}")
            dte.check(not bad, f"table {form}: shapes, styles and plan keys as base_model_tp_plan {bad[:3]}")
            dte.check(comp["tp"]["valid"], f"table {form}: tp 2 valid ({comp['tp'].get('error', '')})")
    finally:
        w.close()


def case_forward():
    w = Work("forward", 10)
    try:
        eager = reference(w.model_dir, w.inputs, attn="eager")[-1]
        print(f"     (transformers sdpa vs eager {(eager - w.states[-1]).abs().max().item():.3g}: they differ only "
              f"where a left-padded query sees no key)")
        forward_at(w, w.model_dir, (1, 2, 4), "forward nested")
    finally:
        w.close()


def case_flat():
    nested = Work("flat_nested", 11)
    w = Work("flat", 11, edit_config=flat_form)
    try:
        c = json.load(open(os.path.join(w.model_dir, "config.json")))
        dte.check("text_config" not in c and c["rope_scaling"]["type"] == "mrope" and "hidden_size" in c,
                  f"flat: config.json in the 4.x form (rope_scaling {c.get('rope_scaling')})")
        dte.check(torch.equal(w.states[-1], nested.states[-1]),
                  "flat: transformers reads the flat and the nested config.json as the same model (bitwise)")
        forward_at(w, w.model_dir, (1, 2, 4), "flat")
        # Both forms at once (transformers 4.5x wrote the text fields at the top level AND in
        # text_config): transformers 5 reads text_config only; here the top-level copies disagree.
        both = os.path.join(nested.dir, "both")
        shutil.copytree(nested.model_dir, both)
        c = json.load(open(os.path.join(both, "config.json")))
        c.update(rope_theta=10000.0, rope_scaling={"type": "mrope", "mrope_section": [8, 0, 0]}, num_hidden_layers=1,
                 hidden_act="gelu")
        json.dump(c, open(os.path.join(both, "config.json"), "w"))
        dte.check(torch.equal(reference(both, nested.inputs)[-1], nested.states[-1]),
                  "flat: with text_config present transformers ignores disagreeing top-level text fields")
        forward_at(nested, both, (1,), "flat+nested (text_config wins)")
    finally:
        w.close()
        nested.close()


def case_layout():
    w = Work("layout", 12)
    try:
        d = w.in_memory_copy()
        names = dte.shapes_of(d)
        dte.check(any(k.startswith("model.visual.") for k in names) and IN_MEMORY + "embed_tokens.weight" in names,
                  "layout: module-name copy written (model.language_model.*, model.visual.*, lm_head)")
        dte.check(torch.equal(reference(d, w.inputs)[-1], w.states[-1]),
                  "layout: transformers loads the module-name layout alike (bitwise)")
        total = sum(math.prod(s) * 4 for s in dte.shapes_of(w.model_dir).values())
        outs = {}
        for tag, folder, prefix in (("saved", w.model_dir, PREFIX), ("in_memory", d, IN_MEMORY)):
            res = forward_at(w, folder, (1, 2), f"layout {tag}")
            for tp, (out, read) in res.items():
                outs[(tag, tp)] = out
                lm = dte.expected_bytes(dte.shapes_of(folder), prefix, w.layers, True, tp)
                dte.check(read == lm, f"layout {tag} tp {tp}: rank 0 read {read} bytes == the language model's "
                                      f"{lm} (file {total}: visual.* and lm_head never read)")
        for tp in (1, 2):
            if ("saved", tp) in outs and ("in_memory", tp) in outs:
                dte.check(torch.equal(outs[("saved", tp)], outs[("in_memory", tp)]),
                          f"layout tp {tp}: both layouts give the same output bitwise")
    finally:
        w.close()


def case_rope():
    w = Work("rope", 13, reference_states=False)
    try:
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(w.model_dir).eval()
        seen, calls = [], []
        rotary = model.model.language_model.rotary_emb
        orig_forward = rotary.forward

        def spy_forward(x, position_ids):
            cos, sin = orig_forward(x, position_ids)
            seen.append((position_ids.clone(), cos.clone(), sin.clone()))
            return cos, sin

        rotary.forward = spy_forward
        orig_index = qmod.Qwen2_5_VLModel.get_rope_index
        qmod.Qwen2_5_VLModel.get_rope_index = lambda *a, **k: calls.append(1) or orig_index(*a, **k)
        try:
            with torch.no_grad():
                model(input_ids=w.inputs["input_ids"], attention_mask=w.inputs["attention_mask"],
                      output_hidden_states=True)
        finally:
            qmod.Qwen2_5_VLModel.get_rope_index = orig_index
        batch, seq = w.inputs["input_ids"].shape
        if not dte.check(len(seen) == 1, f"rope: the text model's rotary embedding ran once ({len(seen)})"):
            return
        pos, cos, sin = seen[0]
        want = torch.arange(seq).view(1, 1, seq).expand(3, batch, seq)
        dte.check(not calls and model.model.rope_deltas is None,
                  f"rope: text-only input never reaches get_rope_index ({len(calls)} calls), rope_deltas "
                  f"{model.model.rope_deltas}")
        dte.check(list(pos.shape) == [3, batch, seq] and torch.equal(pos.cpu(), want),
                  f"rope: position_ids [3, B, S] = arange(S) on all 3 rows and both rows of the padded batch "
                  f"(mask {w.inputs['attention_mask'].tolist()}): {pos[:, :, :4].tolist()} ...")
        inv = rotary.inv_freq.float()
        freqs = (inv[None, :, None] @ torch.arange(seq, dtype=torch.float32)[None, None, :]).transpose(1, 2)
        emb = torch.cat([freqs, freqs], dim=-1)
        dte.check(torch.equal(cos[0], emb.cos()[0].expand_as(cos[0])) and torch.equal(sin[1], emb.sin()[0]),
                  f"rope: mrope cos / sin with sections {rotary.mrope_section} equal plain RoPE over 0..S-1 bitwise")
    finally:
        w.close()
    sliding = dict(TEXT, use_sliding_window=True, sliding_window=5, max_window_layers=1)
    s = Work("rope_sliding", 14, text=sliding)
    try:
        c = json.load(open(os.path.join(s.model_dir, "config.json")))
        full = Work("rope_sliding_off", 14, reference_states=True)
        try:
            dte.check(not torch.equal(full.states[-1], s.states[-1]),
                      f"rope sliding: transformers applies the window (layer_types {c['text_config']['layer_types']})")
        finally:
            full.close()
        forward_at(s, s.model_dir, (1, 2), "rope sliding window 5")
    finally:
        s.close()


def case_hidden():
    w = Work("hidden", 15)
    try:
        # hidden_states[-1] is after the final norm: transformers ties it to last_hidden_state.
        got = []
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(w.model_dir).eval()
        lm = model.model.language_model
        hook = lm.layers[-1].register_forward_hook(lambda mod, args, out: got.append(out[0] if isinstance(out, tuple)
                                                                                     else out))
        with torch.no_grad():
            out = model.model(input_ids=w.inputs["input_ids"], attention_mask=w.inputs["attention_mask"],
                              output_hidden_states=True)
        hook.remove()
        raw = got[-1]
        dte.check(torch.equal(out.hidden_states[-1], out.last_hidden_state)
                  and torch.equal(out.hidden_states[-1], lm.norm(raw))
                  and not torch.allclose(out.hidden_states[-1], raw),
                  f"hidden: transformers' hidden_states[-1] == last_hidden_state == norm(last layer's output) "
                  f"(differs from the raw output by {(out.hidden_states[-1] - raw).abs().max().item():.3g})")
        shapes = dte.shapes_of(w.model_dir)
        for layers, tps in (((1, 3), (1, 2)), ((2,), (2,))):
            for tp in tps:
                label = f"hidden layers {list(layers)} tp {tp}"
                res, err = dte.probe(w.model_dir, w.inputs_path, w.out(f"probe_{tp}_{len(layers)}"), tp, layers)
                if not dte.check(err is None, f"{label}: {err}"):
                    continue
                outs, reports = res
                for k in layers:
                    dte.compare(f"{label} hidden_states.{k}", outs[f"hidden_states.{k}"], w.states[k], FP32_TOL)
                run = max(layers)
                want = dte.expected_bytes(shapes, PREFIX, run, run == w.layers, tp)
                got_bytes = [r["bytes_loaded"] for r in reports]
                dte.check(all(b == want for b in got_bytes) and all(r["layers_run"] == run for r in reports),
                          f"{label}: bytes read per rank {got_bytes} == embeddings + layers [0, {run}) "
                          f"{'+ final norm ' if run == w.layers else ''}= {want}")
                plan = 0 if tp == 1 else 2 * run
                dte.check(all(r["all_reduces"] == r["planned"] == plan for r in reports),
                          f"{label}: AllReduces {[r['all_reduces'] for r in reports]} == plan {plan}")
    finally:
        w.close()


def case_bf16():
    w = Work("bf16", 16)
    try:
        ref = reference(w.model_dir, w.inputs, dtype=torch.bfloat16)[-1]
        print(f"     (transformers bf16 vs fp32 {(ref - w.states[-1]).abs().max().item():.3g}, max|ref| "
              f"{ref.abs().max().item():.3g})")
        res = forward_at(w, w.model_dir, (1, 2, 4), "bf16", states=[ref], dtype="bf16", tol=BF16_TOL)
        print(f"     bf16 max abs diffs: "
              f"{', '.join(f'tp {tp}: {(r[0] - ref).abs().max().item():.3g}' for tp, r in res.items())}")
    finally:
        w.close()


def case_allreduce():
    w = Work("allreduce", 17, reference_states=False)
    try:
        rc, out = dte.mpirun(2, "verify", "--model", w.model_dir, "--tp", "2")
        m = re.search(r"all_reduce calls per forward: (\d+) \(plan: (\d+)\)", out or "")
        tail = (out or "")[-1500:] if rc else ""
        if dte.check(rc == 0 and m is not None, f"allreduce verify tp 2: exit {rc}; {tail}"):
            n, p = int(m.group(1)), int(m.group(2))
            dte.check(n == p == 2 * w.layers, f"allreduce: {n} AllReduces per forward (plan {p}; expected 2 x "
                                              f"{w.layers} layers)")
    finally:
        w.close()


def refused(w, tp, config_edit, code, needle, label):
    """Runs `tprun forward` at tp after `config_edit` of config.json; checks the refusal."""
    path = os.path.join(w.model_dir, "config.json")
    original = open(path).read()
    c = json.loads(original)
    config_edit(c)
    json.dump(c, open(path, "w"))
    try:
        out_path = w.out(f"never_{label}")
        rc, out = dte.mpirun(tp, "forward", "--model", w.model_dir, "--inputs", w.inputs_path, "--out", out_path,
                             "--tp", str(tp), timeout=90)
        if rc is None:
            dte.check(False, f"refusals {label}: {out}")
            return
        lines = [ln for ln in out.splitlines() if needle in ln]
        ranks = {mm.group(1) for ln in lines for mm in [re.search(r"\[r(\d+)/", ln)] if mm}
        dte.check(rc == code and len(ranks) == tp and "bytes this rank" not in out and not os.path.exists(out_path),
                  f"refusals {label}: exit {rc} (want {code}), on ranks {sorted(ranks)} of {tp}, no weight read: "
                  f"{lines[0].strip()[:300] if lines else out[-800:]}")
    finally:
        open(path, "w").write(original)


def case_refusals():
    w = Work("refusals", 18, reference_states=False)
    try:
        def nested_sum(c):
            c["text_config"]["rope_parameters"]["mrope_section"] = [2, 3, 4]

        def flat_sum(c):
            flat_form(c)
            c["rope_scaling"]["mrope_section"] = [3, 3, 3]

        def two_sections(c):
            c["text_config"]["rope_parameters"]["mrope_section"] = [4, 4]

        def absent_section(c):  # the rotary class's default [16, 24, 24] does not fit head_dim 16
            c["text_config"]["rope_parameters"].pop("mrope_section")

        def odd_width(c):
            c["text_config"]["hidden_size"] = 120
            c["text_config"]["num_attention_heads"] = 7
            c["text_config"]["num_key_value_heads"] = 7

        key = "config.json (text_config) (rope_parameters): field 'mrope_section'"
        refused(w, 2, nested_sum, 4, key, "nested mrope_section sum")
        refused(w, 2, flat_sum, 4, "config.json (rope_scaling): field 'mrope_section'", "flat mrope_section sum")
        refused(w, 1, two_sections, 4, key, "mrope_section of 2 entries")
        refused(w, 1, absent_section, 4, key, "mrope_section absent (default [16, 24, 24])")
        refused(w, 2, odd_width, 4, "hidden_size 120 is not num_attention_heads 7", "hidden_size vs heads")
    finally:
        w.close()
    v = Work("refusals_kv", 19, text=dict(TEXT, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                                          rope_parameters=dict(TEXT["rope_parameters"], mrope_section=[4, 6, 6])),
             reference_states=False)
    try:
        refused(v, 4, lambda c: None, 3, "tp 4 does not divide num_key_value_heads 2", "tp 4 vs 2 KV heads")
    finally:
        v.close()


CASES = {"table": case_table, "forward": case_forward, "flat": case_flat, "layout": case_layout, "rope": case_rope,
         "hidden": case_hidden, "bf16": case_bf16, "allreduce": case_allreduce, "refusals": case_refusals}


def main():
    return dte.run_main(CASES)


if __name__ == "__main__":
    sys.exit(main())
