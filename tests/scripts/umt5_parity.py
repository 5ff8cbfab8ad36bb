#!/usr/bin/env python3
"""Wan's text side against the real classes: transformers 5.17's UMT5EncoderModel and T5TokenizerFast,
diffusers 0.40's prompt_clean.

  umt5_parity.py TPRUN MPIRUN UNIT_TESTS [CASE ...]      cases: forward, text

forward  transformers' UMT5EncoderModel built at test time (tiny: 3 layers, d_model 64, 4 heads of 16,
         d_ff 96, gated-gelu, 16 buckets up to distance 24) with EVERY parameter redrawn from a seeded
         generator (weights ~ N(0, clamp(1/sqrt(fan_in), 0.02, 0.2)), the per-layer position biases
         ~ N(0, 1), norm weights ~ N(1, 0.1)), saved with save_pretrained: what it writes is checked
         (shared.weight only for the tied embeddings, a relative_attention_bias in every layer,
         architectures UMT5EncoderModel, model_type umt5). `tprun forward` with WanPipeline's inputs
         (input_ids + attention_mask; rows right-padded with pad id 0 as the tokenizer pads them, one of
         20 tokens, one of 9, one of 1) within 1e-4 (fp32) of transformers' last_hidden_state at tp 1,
         2 and 4; a prompt's own tokens alone (WanConditioner's call) give its rows of the padded call; `tprun verify --tp 2` passes and counts 2 x layers AllReduces; refusals on every rank
         before any weight byte, no hang: tp 3 with 4 heads, block 1's relative_attention_bias removed
         from the checkpoint, model_type "t5" under architectures UMT5EncoderModel.
text     tprun's tiny UMT5 folder (presets::write_umt5_tokenizer, through the unit binary) loads in
         transformers as T5TokenizerFast with len(tokenizer) = the size the writer returned; over a list
         of hostile prompts (characters outside the vocabulary, emoji, HTML entities named / numeric /
         unterminated / double-escaped, whitespace of every kind, "<0x41>"-like byte-piece names, literal
         "▁", added tokens, a prompt past 512 tokens) tprun gives exactly:
           - diffusers' own prompt_clean(prompt) (pipelines/wan/pipeline_wan.py; ftfy forced off as
             tprun has none),
           - the ids and attention mask of WanPipeline._get_t5_prompt_embeds's tokenizer call on the
             cleaned prompt (padding="max_length", max_length=512, truncation=True,
             add_special_tokens=True), through WanConditioner::tokenize (what `tprun tokenize` prints),
           - the tokenizer's ids for the raw prompt at max_length 512 and 16.
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
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decoder_text_encoder_parity as dte  # noqa: E402  (shared runners and checks)
from decoder_text_encoder_parity import check, mpirun  # noqa: E402

FP32_TOL = 1e-4
CONFIG = dict(vocab_size=320, d_model=64, d_kv=16, d_ff=96, num_layers=3, num_decoder_layers=3, num_heads=4,
              relative_attention_num_buckets=16, relative_attention_max_distance=24,
              feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6)
LENGTHS = (20, 9, 1)
SEQ = 20


# ---------------------------------------------------------------------------------------------
# forward


def build(seed):
    from transformers import UMT5Config, UMT5EncoderModel
    model = UMT5EncoderModel(UMT5Config(**CONFIG))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("relative_attention_bias.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * min(max(1.0 / math.sqrt(fan_in), 0.02), 0.2))
            else:  # the T5 layer norms
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed + 1000)
    ids = torch.randint(3, CONFIG["vocab_size"], (len(LENGTHS), SEQ), generator=g)
    mask = torch.zeros(len(LENGTHS), SEQ, dtype=torch.int64)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
        ids[b, n - 1] = 1  # eos
        ids[b, n:] = 0     # <pad>
    return {"input_ids": ids.contiguous(), "attention_mask": mask}


def case_forward():
    from transformers import UMT5EncoderModel
    work = tempfile.mkdtemp(prefix="tprun_umt5_forward_")
    try:
        model_dir = os.path.join(work, "text_encoder")
        build(7).save_pretrained(model_dir)
        saved = load_file(os.path.join(model_dir, "model.safetensors"))
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        biases = sorted(k for k in saved if k.endswith("relative_attention_bias.weight"))
        check("shared.weight" in saved and "encoder.embed_tokens.weight" not in saved,
              "save_pretrained writes shared.weight only for the tied embeddings")
        check(biases == [f"encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight"
                         for i in range(CONFIG["num_layers"])], f"a relative_attention_bias in every layer: {biases}")
        check(cfg.get("architectures") == ["UMT5EncoderModel"] and cfg.get("model_type") == "umt5",
              f"config names UMT5EncoderModel / umt5: {cfg.get('architectures')} {cfg.get('model_type')}")

        inputs = make_inputs(7)
        inputs_path = os.path.join(work, "inputs.safetensors")
        save_file(inputs, inputs_path)
        ref_model = UMT5EncoderModel.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = ref_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
        with torch.no_grad():  # the mask matters (else the test could not tell a masked forward from none)
            unmasked = ref_model(input_ids=inputs["input_ids"]).last_hidden_state
        check((unmasked[1:, :] - ref[1:, :]).abs().max().item() > 1e-2, "the padded rows' mask changes the output")
        for tp in (1, 2, 4):
            out = os.path.join(work, f"out_tp{tp}.safetensors")
            rc, log = mpirun(tp, "forward", "--model", model_dir, "--inputs", inputs_path, "--out", out, "--tp", str(tp),
                             "--dtype", "fp32")
            if not check(rc == 0, f"forward tp {tp} ran" + ("" if rc == 0 else f": exit {rc}: {(log or '')[-2000:]}")):
                continue
            got = load_file(out)["last_hidden_state"].float()
            if not check(got.shape == ref.shape, f"forward tp {tp} shape {list(got.shape)} vs {list(ref.shape)}"):
                continue
            d = (got - ref).abs()
            check(d.max().item() <= FP32_TOL, f"forward tp {tp}: max abs diff {d.max().item():.3g}, mean "
                  f"{d.mean().item():.3g} (tolerance {FP32_TOL}; max|ref| {ref.abs().max().item():.3g})")

        # WanConditioner runs the encoder on a prompt's own tokens (no padding, no mask): the same rows as
        # WanPipeline's padded + masked call, which it then zero-pads (u[:v] then zeros).
        own = os.path.join(work, "own.safetensors")
        n = LENGTHS[1]
        save_file({"input_ids": inputs["input_ids"][1:2, :n].contiguous()}, own)
        out = os.path.join(work, "own_out.safetensors")
        rc, log = mpirun(2, "forward", "--model", model_dir, "--inputs", own, "--out", out, "--tp", "2")
        if check(rc == 0, "forward on a prompt's own tokens ran" + ("" if rc == 0 else f": {(log or '')[-1500:]}")):
            d = (load_file(out)["last_hidden_state"].float()[0] - ref[1, :n]).abs().max().item()
            check(d <= FP32_TOL, f"a prompt's own {n} tokens unpadded (tp 2) = its rows of the padded, masked "
                  f"forward: max abs diff {d:.3g}")
        rc, log = mpirun(2, "verify", "--model", model_dir, "--tp", "2")
        m = re.search(r"all_reduce calls per forward: (\d+) \(plan: (\d+)\)", log or "")
        check(rc == 0 and m is not None and int(m.group(1)) == int(m.group(2)) == 2 * CONFIG["num_layers"],
              f"verify --tp 2: exit {rc}, AllReduces {m.groups() if m else None} (expected {2 * CONFIG['num_layers']}); "
              f"{(log or '')[-600:] if rc != 0 or m is None else ''}")
        refusals(work, model_dir, inputs_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def refusals(work, model_dir, inputs_path):
    def variant(name, edit_config=None, drop=None):
        d = os.path.join(work, name)
        shutil.copytree(model_dir, d)
        if edit_config:
            p = os.path.join(d, "config.json")
            c = json.load(open(p))
            edit_config(c)
            json.dump(c, open(p, "w"))
        if drop:
            w = load_file(os.path.join(d, "model.safetensors"))
            del w[drop]
            save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return d

    bias1 = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"
    cases = [("tp 3 with 4 heads", model_dir, 3, 3, "tp 3 does not divide num_heads"),
             ("block 1's position bias missing", variant("nobias", drop=bias1), 2, 4, bias1),
             ("model_type t5 under UMT5EncoderModel", variant("t5type", edit_config=lambda c: c.update(model_type="t5")),
              2, 4, "model_type 't5' is not a UMT5 encoder")]
    for label, d, tp, code, needle in cases:
        t0 = time.time()
        rc, log = mpirun(tp, "forward", "--model", d, "--inputs", inputs_path, "--out", os.path.join(work, "x.st"),
                         "--tp", str(tp), timeout=120)
        ranks = len(re.findall(re.escape(needle), log or ""))
        check(rc == code and ranks >= 1, f"refused: {label}: exit {rc} (expected {code}), '{needle}' "
              f"{'found' if ranks else 'not found'} ({time.time() - t0:.1f}s); {(log or '')[-400:] if rc != code else ''}")


# ---------------------------------------------------------------------------------------------
# text

LONG = " ".join(["A red fox runs through fresh snow at dawn, cinematic, 8k."] * 70)
PROMPTS = [
    "A red fox runs through fresh snow at dawn.",
    "",
    "   ",
    "  leading, trailing  and   inner   spaces  ",
    "tabs\tand\nnewlines\r\nCRLF\rCR\x0bVT\x0cFF\x1cFS\x1dGS\x1eRS\x1fUS\x85NEL",
    "\x1c\x1d ends and inner \x1c\x1f info separators \x1e \x1f",
    "\u00a0nbsp\u2009thin\u200bzwsp\ufeffbom\u3000ideographic\u2028LS\u2029PS\u202fnnbsp\u205fmmsp\u1680ogham",
    "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e vs cafe\u0301 (decomposed), A\u030a ring, \u1100\u1161 jamo",
    "\u6771\u4eac\u306e\u591c\u666f \u4e00\u53ea\u72d0\u72f8 \u043b\u0438\u0441\u0430 \u0645\u0631\u062d\u0628\u0627"
    " \u0928\u092e\u0938\u094d\u0924\u0947 \ud55c\uad6d\uc5b4",
    "emoji \U0001F98A\U0001F315\U0001F3A8 family \U0001F469\u200d\U0001F469\u200d\U0001F467 flag \U0001F3F3\ufe0f"
    "\u200d\U0001F308 skin \U0001F44D\U0001F3FD \U0001FAE8\U0001FAE9",
    "\uff26\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48 \uff21\uff22\uff23 \uff11\uff12\uff13 \ufb01 ligature "
    "\u2168 \u00bd \u2122 \u210c \u2460",
    "html: &amp; &lt;b&gt; &quot;q&quot; &#39;s &#x27;x &nbsp;nb &copy; &eacute; &AElig; &notin; &notit; &amp",
    "double: &amp;amp; &amp;lt;tag&amp;gt; &amp;#233; &amp;#x1F98A;",
    "numeric: &#0; &#13; &#128; &#150; &#x80; &#xD800; &#x110000; &#99999999999999999999; &#1; &#x7F; &#xFDD0;"
    " &#65 &#x41 &#; &#x; &# &x",
    "names: &ampx &notit; &Eacute &eacutex &frac12; &ThickSpace; &NewLine; &Tab; &a; &zz; &;",
    "&&amp;&&#38;#38; && & ;&; &\u00e9t\u00e9; &amp\u00e9 &" + "a" * 40 + ";",
    "<0x41> <0xF0><0x9F> \u2581 \u2581\u2581x a\u2581b \u2581lead",
    "added: <extra_id_0> sentinel <extra_id_299> and </s> eos, <pad> <unk> <extra_id_7>x",
    "control \x07 bell \x1b esc \x7f del \u0000 nul \u00ad shy \u200e lrm",
    "It's a dog's life, we'll see -- 100% sure! $19.99 + tax; x[i] = {a*b} | path\\dir ^ `tick` ~ @ #",
    LONG,
    "\u00e9" * 600,
]


def unit(test, env):
    r = subprocess.run([dte.UNIT, f"--gtest_filter={test}"], env={**os.environ, **env}, capture_output=True, text=True,
                       timeout=600)
    ok = r.returncode == 0 and "SKIPPED" not in r.stdout
    return ok, (r.stdout + r.stderr)[-3000:]


def random_prompts(n, seed):
    """Seeded concatenations of hostile fragments (entities split across fragments, whitespace runs, marks)."""
    import random
    rng = random.Random(seed)
    frags = ["a", "fox", " ", "  ", "\t", "\n", "\u3000", "\u00a0", "\x1c", "&", "amp;", "&amp;", "&lt", "#", "#x",
             "41", ";", "&#x1F98A;", "&eacute", "caf\u00e9", "e\u0301", "\U0001F98A", "\U0001F469\u200d", "\u2581",
             "<0x41>", "<extra_id_0>", "</s>", "<pad>", "\uff21", "\ufb01", "\u6771\u4eac", "\u043b\u0438\u0441",
             "\u0928\u092e\u0938\u094d", "\u200b", "\ufeff", "\u0085", "snow", ",", "."]
    return ["".join(rng.choices(frags, k=rng.randint(1, 24))) for _ in range(n)]


def tprun_dump(work, tag, pipe, folder, prompts, lengths):
    req = os.path.join(work, f"request_{tag}.json")
    out = os.path.join(work, f"dump_{tag}.json")
    json.dump({"pipeline": pipe, "tokenizer": folder, "prompts": prompts, "lengths": lengths, "out": out},
              open(req, "w"))
    ok, log = unit("Umt5TokenizerFiles.DumpForParity", {"TPRUN_UMT5_TOKENIZER_DUMP": req})
    if not check(ok and os.path.exists(out), f"{tag}: tprun tokenized the prompts" + ("" if ok else f": {log}")):
        return None
    return json.load(open(out))


def pipeline_folder(work, tag, folder):
    """A pipeline folder for WanConditioner::tokenize: model_index.json naming the tokenizer."""
    pipe = os.path.join(work, f"pipe_{tag}")
    os.makedirs(pipe)
    shutil.copytree(folder, os.path.join(pipe, "tokenizer"))
    json.dump({"_class_name": "WanPipeline", "_diffusers_version": "0.40.0",
               "tokenizer": ["transformers", "T5TokenizerFast"]}, open(os.path.join(pipe, "model_index.json"), "w"))
    return pipe


def compare_folder(work, tag, folder, prompts, prompt_clean):
    """tprun vs transformers / diffusers on `folder` over `prompts`; returns (prompts with <unk>, truncated)."""
    import transformers
    tok = transformers.T5TokenizerFast.from_pretrained(folder)
    lengths = [512, 16]
    got = tprun_dump(work, tag, pipeline_folder(work, tag, folder), folder, prompts, lengths)
    if got is None:
        return 0, 0
    bad = {"clean": 0, "pipeline": 0, "raw": 0}
    unk_prompts = truncated = 0
    for prompt, g in zip(prompts, got):
        if "error" in g:
            check(False, f"{tag}: tprun failed on {prompt[:60]!r}: {g['error']}")
            continue
        clean = prompt_clean(prompt)
        if g["clean"] != clean:
            bad["clean"] += 1
            check(False, f"{tag}: prompt_clean({prompt[:80]!r}): tprun {g['clean'][:120]!r} vs diffusers {clean[:120]!r}")
        enc = tok(clean, padding="max_length", max_length=512, truncation=True, add_special_tokens=True,
                  return_attention_mask=True)
        if g["pipeline_ids"] != enc["input_ids"] or g["pipeline_mask"] != enc["attention_mask"]:
            bad["pipeline"] += 1
            check(False, f"{tag}: pipeline ids for {prompt[:60]!r}: tprun {g['pipeline_ids'][:24]} vs transformers "
                         f"{enc['input_ids'][:24]}")
        unk_prompts += tok.unk_token_id in enc["input_ids"]
        truncated += len(tok(clean)["input_ids"]) > 512
        for n in lengths:
            want = tok(prompt, padding="max_length", max_length=n, truncation=True)["input_ids"]
            if g["ids"][str(n)] != want:
                bad["raw"] += 1
                check(False, f"{tag}: raw ids at {n} for {prompt[:60]!r}: tprun {g['ids'][str(n)][:24]} vs "
                             f"transformers {want[:24]}")
    check(not any(bad.values()), f"{tag}: {len(prompts)} prompts: prompt_clean, pipeline ids + masks (512) and raw "
          f"ids (512, 16) exact ({unk_prompts} prompts hold <unk>, {truncated} truncated at 512)")
    return unk_prompts, truncated


def hub_like_variant(work, folder):
    """The same tokenizer as a transformers 4.x conversion of UMT5's spiece.model may write it: normalizer
    Sequence[Precompiled, Replace(' {2,}' -> ' ')], byte_fallback true, the sentinels NOT in the model's vocab
    but added tokens past it (ids as tokenizer_config.json declares them)."""
    d = os.path.join(work, "hub_like")
    shutil.copytree(folder, d)
    p = os.path.join(d, "tokenizer.json")
    t = json.load(open(p, encoding="utf-8"))
    t["normalizer"] = {"type": "Sequence", "normalizers": [
        t["normalizer"], {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
    vocab = t["model"]["vocab"]
    t["model"]["vocab"] = [v for v in vocab if not v[0].startswith("<extra_id_")]
    t["model"]["byte_fallback"] = True
    json.dump(t, open(p, "w", encoding="utf-8"), ensure_ascii=False)
    return d


def case_text():
    import transformers
    from diffusers.pipelines.wan import pipeline_wan
    pipeline_wan.is_ftfy_available = lambda: False  # tprun has no ftfy (wan_prompt_clean.h)
    work = tempfile.mkdtemp(prefix="tprun_umt5_text_")
    try:
        ok, log = unit("Umt5TokenizerFiles.WriteForParity", {"TPRUN_UMT5_TOKENIZER_WRITE": work})
        if not check(ok, "tprun wrote its UMT5 tokenizer folder" + ("" if ok else f": {log}")):
            return
        folder = os.path.join(work, "tokenizer")
        size = json.load(open(os.path.join(work, "written_size.json")))["size"]
        check(sorted(os.listdir(folder)) == ["special_tokens_map.json", "spiece.model", "tokenizer.json",
                                             "tokenizer_config.json"], f"the hub's files: {sorted(os.listdir(folder))}")
        tok = transformers.T5TokenizerFast.from_pretrained(folder)
        check(len(tok) == size, f"transformers loads it ({type(tok).__name__}), len {len(tok)} = tprun's {size}")
        prompts = PROMPTS + random_prompts(150, 33)
        unk_prompts, truncated = compare_folder(work, "written", folder, prompts, pipeline_wan.prompt_clean)
        check(unk_prompts >= 3 and truncated >= 2, "the list reaches <unk> and truncation")
        hub = hub_like_variant(work, folder)
        check(len(transformers.T5TokenizerFast.from_pretrained(hub)) == size, "hub-like variant: same length")
        compare_folder(work, "hub_like", hub, prompts, pipeline_wan.prompt_clean)
    finally:
        shutil.rmtree(work, ignore_errors=True)


CASES = {"forward": case_forward, "text": case_text}


def main():
    return dte.run_main(CASES)


if __name__ == "__main__":
    sys.exit(main())
