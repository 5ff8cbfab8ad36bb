#!/usr/bin/env python3
"""tprun's vocab.json + merges.txt tokenizer layout (src/text/hf_vocab_merges.h) and its batch
encoding (hf_tokenizer_batch.h) against transformers 5, on Qwen-Image's tokenizer (Qwen2.5-VL,
Qwen2Tokenizer; the hub ships it without tokenizer.json).

  qwen_image_tokenizer_parity.py UNIT_TEST_BINARY

(1) tprun writes its Qwen2.5-VL folder (tprun_unit_tests --gtest_filter=HfVocabMerges.WriteForParity:
    bundled corpus, 400 merges, slow layout); transformers' AutoTokenizer loads it offline as
    Qwen2Tokenizer with right padding, pad <|endoftext|>, eos <|im_end|>, no bos.
(2) More folders of the same and of another tokenizer: tprun's folder re-saved by transformers
    (tokenizer.json + tokenizer_config.json: the fast layout of the same tokenizer); the same
    without added_tokens_decoder (the legacy added_tokens.json + special_tokens_map.json path);
    a folder made by the tokenizers library and transformers (a BPE trained with tokenizers,
    AutoTokenizer.save_pretrained), and the same tokenizer without tokenizer.json (the model's own
    vocab.json / merges.txt; the added tokens in added_tokens_decoder, or in added_tokens.json +
    special_tokens_map.json); and tprun's re-saved folder with a broken vocab.json / merges.txt next to
    its tokenizer.json (tokenizer.json is read first: same ids).
(3) On every folder, the tokenizer test prompts of hf_tokenizer_parity.py, seeded random ones and
    the Qwen-Image prompt template around some of them go through transformers and through tprun
    (HfVocabMerges.DumpForParity): plain ids, ids with special tokens, padding="max_length" +
    truncation at 1058 and 16 (ids and attention masks), and batches as QwenImagePipeline calls the
    tokenizer: tokenizer(texts, max_length=1024 + 34, padding=True, truncation=True,
    return_tensors="pt") (and at max_length 40, which truncates). All exact; both layouts of one
    tokenizer give identical ids, in transformers and in tprun.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_tokenizer_parity as base  # noqa: E402  (prompts, corpus, the tokenizers-library BPE)

# diffusers pipelines/qwenimage/pipeline_qwenimage.py
TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
            "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
            "<|im_start|>assistant\n")
DROP_IDX = 34
MAX_LENGTH = 1024 + DROP_IDX
LENGTHS = [MAX_LENGTH, 16]
QWEN25VL_ADDED = [t for t in base.QWEN3_ADDED if t[0] not in ("<tool_response>", "</tool_response>", "<think>",
                                                               "</think>")]


def check_template_is_diffusers():
    """The template and sizes above are the ones QwenImagePipeline uses."""
    import inspect
    from diffusers.pipelines.qwenimage import pipeline_qwenimage as p
    src = inspect.getsource(p.QwenImagePipeline)
    assert repr(TEMPLATE)[1:-1] in src or TEMPLATE.replace("\n", "\\n") in src, "prompt template changed in diffusers"
    assert "self.tokenizer_max_length = 1024" in src and "self.prompt_template_encode_start_idx = 34" in src
    assert "max_length=self.tokenizer_max_length + drop_idx, padding=True, truncation=True" in src


def make_hf_folders(tmp):
    """A Qwen2.5-VL-like tokenizer made by the tokenizers library and saved by transformers
    (hf_made_fast: tokenizer.json + tokenizer_config.json), and the same tokenizer in the slow layout:
    the model's own vocab.json / merges.txt (tokenizers' BPE.save) with the added tokens as
    transformers 4 saved them, in tokenizer_config.json's added_tokens_decoder (hf_made_slow, as the
    hub's Qwen-Image files) or in added_tokens.json + special_tokens_map.json (hf_made_slow_legacy,
    written as transformers' legacy writer does: added tokens with ids past the vocabulary)."""
    import transformers
    from tokenizers import AddedToken, normalizers, processors
    tok = base.bytelevel_bpe(base.QWEN2_PATTERN, 700, [], False)
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for content, special in QWEN25VL_ADDED:
        (tok.add_special_tokens if special else tok.add_tokens)([AddedToken(content, special=special, normalized=False)])
    raw = os.path.join(tmp, "hf_raw")
    os.makedirs(raw)
    tok.save(os.path.join(raw, "tokenizer.json"))
    base.dump(os.path.join(raw, "tokenizer_config.json"), {
        "add_prefix_space": False, "added_tokens_decoder": base.decoder_of(tok),
        "additional_special_tokens": [c for c, s in QWEN25VL_ADDED[1:14]], "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    t = transformers.AutoTokenizer.from_pretrained(raw, local_files_only=True)
    fast = os.path.join(tmp, "hf_made_fast")
    t.save_pretrained(fast)
    t.backend_tokenizer.model.save(fast)  # vocab.json, merges.txt
    decoder = {str(i): a.__getstate__() for i, a in t.added_tokens_decoder.items()}
    without(fast, os.path.join(tmp, "hf_made_slow"), ["tokenizer.json"],
            lambda c: c.update({"added_tokens_decoder": decoder}))
    legacy = os.path.join(tmp, "hf_made_slow_legacy")
    without(fast, legacy, ["tokenizer.json"])
    base.dump(os.path.join(legacy, "added_tokens.json"),
              {c: i for c, i in t.added_tokens_encoder.items() if i >= t.vocab_size})
    base.dump(os.path.join(legacy, "special_tokens_map.json"), t.special_tokens_map)
    shutil.rmtree(raw)


def without(src, dst, names, config_edit=None):
    shutil.copytree(src, dst)
    for n in names:
        if os.path.exists(os.path.join(dst, n)):
            os.remove(os.path.join(dst, n))
    if config_edit:
        p = os.path.join(dst, "tokenizer_config.json")
        cfg = json.load(open(p, encoding="utf-8"))
        config_edit(cfg)
        base.dump(p, cfg)


def transformers_results(path, prompts, batches):
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    results = []
    for prompt in prompts:
        r = {"plain": tok(prompt, add_special_tokens=False)["input_ids"], "special": tok(prompt)["input_ids"]}
        for n in LENGTHS:
            e = tok(prompt, padding="max_length", truncation=True, max_length=n)
            r[f"padded_{n}"] = {"input_ids": e["input_ids"], "attention_mask": e["attention_mask"]}
        results.append(r)
    out_batches = []
    for b in batches:  # as QwenImagePipeline._get_qwen_prompt_embeds calls it
        e = tok(b["texts"], max_length=b["max_length"], padding=True, truncation=True, return_tensors="pt")
        out_batches.append({"input_ids": e["input_ids"].tolist(), "attention_mask": e["attention_mask"].tolist()})
    info = {"class": type(tok).__name__, "padding_side": tok.padding_side, "pad": tok.pad_token,
            "eos": tok.eos_token, "bos": tok.bos_token, "max_len": tok.model_max_length}
    return {"vocab_size": max(tok.get_vocab().values()) + 1, "results": results, "batches": out_batches, "info": info}


def run_tprun(binary, env_name, value, test):
    env = dict(os.environ)
    env[env_name] = value
    p = subprocess.run([binary, f"--gtest_filter={test}"], env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or "[  PASSED  ] 1 test" not in p.stdout:
        print(p.stdout[-4000:], p.stderr[-4000:])
        sys.exit(f"{test} failed")


def check(binary):
    check_template_is_diffusers()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        run_tprun(binary, "TPRUN_QWEN_TOKENIZER_WRITE", tmp, "HfVocabMerges.WriteForParity")
        sizes = json.load(open(os.path.join(tmp, "written_sizes.json")))
        written = os.path.join(tmp, "written_qwen25vl")
        import transformers
        t = transformers.AutoTokenizer.from_pretrained(written, local_files_only=True)
        t.save_pretrained(os.path.join(tmp, "written_resaved"))  # + tokenizer.json: the fast layout
        without(written, os.path.join(tmp, "written_legacy"), [], lambda c: c.pop("added_tokens_decoder"))
        make_hf_folders(tmp)
        # tokenizer.json first: broken slow files next to it are not read (by transformers nor tprun).
        without(os.path.join(tmp, "written_resaved"), os.path.join(tmp, "resaved_broken_slow"), [])
        for name, text in (("vocab.json", "{not json"), ("merges.txt", "x y z\n")):
            with open(os.path.join(tmp, "resaved_broken_slow", name), "w", encoding="utf-8") as f:
                f.write(text)
        names = ["written_qwen25vl", "written_resaved", "written_legacy", "hf_made_fast", "hf_made_slow",
                 "hf_made_slow_legacy", "resaved_broken_slow"]
        assert not os.path.exists(os.path.join(written, "tokenizer.json"))
        assert os.path.exists(os.path.join(tmp, "written_resaved", "tokenizer.json"))
        assert os.path.exists(os.path.join(tmp, "hf_made_slow", "vocab.json"))
        pairs = [("written_qwen25vl", "written_resaved"), ("written_qwen25vl", "written_legacy"),
                 ("hf_made_fast", "hf_made_slow"), ("hf_made_fast", "hf_made_slow_legacy"),
                 ("written_resaved", "resaved_broken_slow")]

        prompts = base.PROMPTS + base.fuzz_prompts(120, seed=4321)
        templated = [TEMPLATE.format(p) for p in base.PROMPTS]
        prompts += templated
        batches = [{"texts": templated[:4], "max_length": MAX_LENGTH},
                   {"texts": templated, "max_length": MAX_LENGTH},
                   {"texts": [templated[17], templated[1]], "max_length": MAX_LENGTH},  # long + empty prompt
                   {"texts": [templated[0]], "max_length": MAX_LENGTH},
                   {"texts": templated[:6], "max_length": 40},
                   {"texts": [TEMPLATE.format(base.LONG * 3)], "max_length": MAX_LENGTH}]  # truncated at 1058
        folders = [{"name": n, "path": os.path.join(tmp, n), "class": "Qwen2Tokenizer"} for n in names]
        folders.append({"name": "written_autotokenizer", "path": written, "class": ""})
        request = os.path.join(tmp, "request.json")
        out = os.path.join(tmp, "tprun.json")
        base.dump(request, {"folders": folders, "prompts": prompts, "lengths": LENGTHS, "batches": batches, "out": out},
                  indent=None)
        run_tprun(binary, "TPRUN_QWEN_TOKENIZER_DUMP", request, "HfVocabMerges.DumpForParity")
        mine = json.load(open(out, encoding="utf-8"))

        theirs_by_name = {}
        compared = 0
        for f in folders:
            theirs = transformers_results(f["path"], prompts, batches)
            theirs_by_name[f["name"]] = theirs
            ours = mine[f["name"]]
            if "error" in ours:
                failures.append(f"{f['name']}: tprun refused the folder: {ours['error']}")
                continue
            if theirs["info"]["class"] != "Qwen2Tokenizer":
                failures.append(f"{f['name']}: AutoTokenizer built {theirs['info']['class']}")
            if f["name"] in sizes and sizes[f["name"]] != theirs["vocab_size"]:
                failures.append(f"{f['name']}: writer returned {sizes[f['name']]}, transformers has {theirs['vocab_size']}")
            if ours["vocab_size"] != theirs["vocab_size"]:
                failures.append(f"{f['name']}: vocab_size {ours['vocab_size']} vs {theirs['vocab_size']}")
            for k, prompt in enumerate(prompts):
                for key, want in theirs["results"][k].items():
                    if ours["results"][k][key] != want:
                        failures.append(f"{f['name']} prompt {k} {key}: {prompt[:80]!r}\n  transformers {want}\n"
                                        f"  tprun        {ours['results'][k][key]}")
                compared += 1
            for k, (want, got) in enumerate(zip(theirs["batches"], ours["batches"])):
                if want != got:
                    failures.append(f"{f['name']} batch {k}: transformers {want} vs tprun {got}")
                compared += 1
        info = theirs_by_name["written_qwen25vl"]["info"]
        print(f"transformers on tprun's folder: {info}")
        expected = {"class": "Qwen2Tokenizer", "padding_side": "right", "pad": "<|endoftext|>", "eos": "<|im_end|>",
                    "bos": None, "max_len": 131072}
        if info != expected:
            failures.append(f"tprun's folder loads in transformers as {info}, expected {expected}")
        for a, b in pairs:  # both layouts of one tokenizer: identical ids
            if theirs_by_name[a]["results"] != theirs_by_name[b]["results"]:
                failures.append(f"transformers gives different ids for {a} and {b}")
            if "error" not in mine[a] and "error" not in mine[b] and mine[a]["results"] != mine[b]["results"]:
                failures.append(f"tprun gives different ids for {a} and {b}")
        lens = [len(r) for r in theirs_by_name["written_qwen25vl"]["batches"][1]["input_ids"]]
        print(f"pipeline batch of {len(templated)} templated prompts: padded to {lens[0]} ids "
              f"(the long one truncated to {len(theirs_by_name['written_qwen25vl']['batches'][5]['input_ids'][0])})")
    for line in failures[:40]:
        print("FAIL", line)
    print(f"{compared} folder x (prompt | batch) cases compared ({len(folders)} folders x {len(prompts)} prompts + "
          f"{len(batches)} batches; plain, with special tokens, padded/truncated at {LENGTHS}, pipeline batches): "
          f"{'all exact' if not failures else f'{len(failures)} differences'}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 2:
        sys.exit(check(sys.argv[1]))
    sys.exit(__doc__)
