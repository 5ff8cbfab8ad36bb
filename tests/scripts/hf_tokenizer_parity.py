#!/usr/bin/env python3
"""tprun's tokenizer.json tokenizers and FLUX.2 chat templates (src/text/hf_tokenizer.h,
chat_template.h) against transformers 5 and the tokenizers library.

  hf_tokenizer_parity.py --regen
      (Re)makes the fixture folders in tests/data/hf_tokenizers with the tokenizers library
      (qwen3: Qwen2's NFC + split regex + ByteLevel BPE with Qwen3's added tokens and first
      chat template; mistral3: Mistral's tekken split regex, BPE with ignore_merges, <s>
      TemplateProcessing, PixtralProcessor files, legacy chat_template.json; generic: NFKC,
      GPT-2 ByteLevel(use_regex, add_prefix_space), added tokens with lstrip / rstrip /
      single_word / normalized, left padding and truncation; fallback: no ByteLevel, NFD,
      byte_fallback with an unk token) and writes the ids transformers gives into cases.json.

  hf_tokenizer_parity.py UNIT_TEST_BINARY
      The ctest check: (1) cases.json still equals what this venv's transformers gives;
      (2) tprun writes its own Qwen3 and Mistral-3 folders (tprun_unit_tests
      --gtest_filter=HfTokenizerFiles.WriteForParity, which first checks that they load back with
      the size the writer returned and that each added token encodes to its id); (3) on every folder, the fixture
      prompts and seeded random ones go through transformers and through tprun
      (HfTokenizerFiles.DumpForParity): plain ids, ids with special tokens, padded and
      truncated ids + attention masks at 512 and 16, and the pipelines' chat encodings
      (Flux2KleinPipeline's tokenizer path, Flux2Pipeline's processor path), all exact;
      (4) AutoTokenizer loads tprun's folders offline, and AutoProcessor gives a
      PixtralProcessor where torchvision is installed (PixtralProcessor requires it);
      (5) the mistral3 fixture with the tokenizer_class names the hub's processor folders carry
      (LlamaTokenizerFast with add_bos_token / legacy, PreTrainedTokenizerFast, TokenizersBackend)
      loaded as PixtralProcessor and as AutoProcessor: ids equal transformers' PixtralProcessor
      (which loads TokenizersBackend whatever the class says); through AutoTokenizer (which builds
      LlamaTokenizer) tprun still refuses the LlamaTokenizerFast one;
      (6) variants of the known chat templates (re-indented, re-quoted, CRLF, comments, ...
      and ones that emit something else): tprun recognises exactly those that Jinja
      renders like the known template on the pipelines' messages.

The processor path is transformers' ProcessorMixin.apply_chat_template step by step
(the template the processor files hold, rendered by transformers' render_jinja_template with
the tokenizer's special tokens, add_special_tokens=False when the text starts with bos_token,
then the tokenizer with padding="max_length", truncation=True), and the real
PixtralProcessor where it loads.
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "tests", "data", "hf_tokenizers")
TEXTS_CPP = os.path.join(ROOT, "src", "text", "chat_template_texts.cpp")

QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
TEKKEN_PATTERN = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"

QWEN3_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
               ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
               ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
               ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
               ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
               ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
               ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
               ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
               ("<think>", False), ("</think>", False)]
MISTRAL_NAMED = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                 "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
                 "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                 "[TOOL_CONTENT]"]

LONG = " ".join(["A photo of a cat sitting on a red chair, 8k, highly detailed, cinematic lighting."] * 60)
PROMPTS = [
    "A photo of a cat sitting on a red chair.",
    "",
    "東京の夜景、ネオンが輝く街並み",
    "中文提示：一只在月光下奔跑的狐狸，水墨画风格",
    "👩‍👩‍👧‍👦 family emoji with ZWJ, 🏳️‍🌈 flag and 👍🏽 skin tone",
    "e\u0301 combining acute, A\u030a ring, n\u0303 tilde, \u1100\u1161 jamo",
    "مرحبا بالعالم، صورة لقطة تجلس على كرسي أحمر",
    "Numbers 1234567890, 3.14159, 1,000,000 and ١٢٣ and ⅷ and ²³",
    "  leading and   multiple   spaces   ",
    "tabs\tand\nnewlines\n\nand\r\nCRLF\rCR\u2028LS\u0085NEL",
    "special tokens inside: <|im_start|>user\n hi <|im_end|> <think> </think> <s> [INST] </s> <|endoftext|>",
    "It's a dog's life, we'll see, they're here, I'M LOUD, 'S x'ſt I'VE",
    "Ünïcödé façade naïve café — “quotes” ‘single’ … ½ ™ ©",
    "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) // \\\\",
    "http://example.com/path/to?query=1&x=2#frag e-mail@example.org",
    "\u3000ideographic space\u00a0nbsp\u2009thin\u200bzwsp\ufeffbom",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ﬁ ligature ℌ",
    LONG,
    "ǅungla Ǆ titlecase ǈ ǋ",
    "x" * 300,
    "[IMG][IMG] image tokens in prompt [IMG_BREAK] [SYSTEM_PROMPT]",
    "control \x07 bell \x00 nul \x1b esc \x7f del",
    "Hello世界123abc한국어ABCdefΩmega",
    "tab\t\t\tindent    and trailing\n",
    "<|im_start|><|im_start|>  <|im_end|>\n\n",
    "  <bos>  lstrip rstrip <bos> foo<mid>bar <word> word<word>x  <word>  ",
    "Grüße aus Köln: Straße, Maß, ẞ",
    "Emoji only 🦊🌕🎨🖌️",
    "日本語とEnglishのmixed文章です。テスト123",
    "a\u0308\u0301 stacked marks and \u0915\u094d\u0937 Devanagari",
]


def template_texts():
    """The known template texts, from src/text/chat_template_texts.cpp."""
    src = open(TEXTS_CPP, encoding="utf-8").read()
    texts = re.findall(r'R"JINJA\((.*?)\)JINJA"', src, re.S)
    assert len(texts) == 3, len(texts)
    return {"qwen3_first": texts[0], "qwen3_later": texts[1], "mistral3": texts[2]}


def corpus():
    base = [
        "A photo of a cat sitting on a red chair.", "a watercolor painting of a fox in the snow",
        "portrait of an old man with a beard, dramatic lighting, 35mm", "It's a sunny day and we're at the beach.",
        "東京の夜景、ネオンが輝く街並み", "一只在月光下奔跑的狐狸", "مرحبا بالعالم", "Ünïcödé façade naïve café",
        "Numbers 1234567890 and 3.14159", "The quick brown fox jumps over the lazy dog.",
        "HelloWorld CamelCase URLs like http://example.com/path", "emoji 🦊🌕🎨 and 👩‍👩‍👧‍👦",
    ]
    return base * 20


def bytelevel_bpe(pattern, vocab_size, specials, ignore_merges):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers, Regex
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials, show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return tok


def dump(path, obj, indent=2):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False, sort_keys=True)
        f.write("\n")


def decoder_of(tok):
    j = json.loads(tok.to_str())
    return {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for a in j["added_tokens"]}


def make_qwen3(out, templates):
    from tokenizers import AddedToken, normalizers, processors
    tok = bytelevel_bpe(QWEN2_PATTERN, 600, [], False)
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for content, special in QWEN3_ADDED:
        (tok.add_special_tokens if special else tok.add_tokens)([AddedToken(content, special=special, normalized=False)])
    os.makedirs(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    dump(os.path.join(out, "tokenizer_config.json"), {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder_of(tok),
        "additional_special_tokens": [c for c, s in QWEN3_ADDED[1:14]], "bos_token": None,
        "chat_template": templates["qwen3_first"], "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})


def make_mistral3(out, templates):
    from tokenizers import processors
    specials = MISTRAL_NAMED + [f"<SPECIAL_{i}>" for i in range(len(MISTRAL_NAMED), 40)]
    tok = bytelevel_bpe(TEKKEN_PATTERN, 700, specials, True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1", special_tokens=[("<s>", 1)])
    os.makedirs(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    dump(os.path.join(out, "tokenizer_config.json"), {
        "added_tokens_decoder": decoder_of(tok), "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<pad>", "model_max_length": 131072, "processor_class": "PixtralProcessor",
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False})
    dump(os.path.join(out, "special_tokens_map.json"),
         {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})
    dump(os.path.join(out, "processor_config.json"), {
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]", "patch_size": 14,
        "processor_class": "PixtralProcessor", "spatial_merge_size": 2})
    dump(os.path.join(out, "preprocessor_config.json"), {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "PixtralImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": {"height": 14, "width": 14},
        "processor_class": "PixtralProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
        "size": {"longest_edge": 1540}})
    dump(os.path.join(out, "chat_template.json"), {"chat_template": templates["mistral3"]})


def make_generic(out, templates):
    from tokenizers import Tokenizer, AddedToken, models, normalizers, pre_tokenizers, processors, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<bos>", "<eos>", "<pad>"], show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>", pair="<bos> $A <eos> $B:1 <eos>:1",
                                                       special_tokens=[("<bos>", 0), ("<eos>", 1)])
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                            AddedToken("<|im_end|>", special=True, normalized=False)])
    tok.add_tokens([AddedToken("<mid>", lstrip=True, rstrip=True, normalized=False),
                    AddedToken("<word>", single_word=True, normalized=True),
                    AddedToken("ﬁ", normalized=True), AddedToken("<think>", normalized=False),
                    AddedToken("</think>", normalized=False)])
    os.makedirs(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    dump(os.path.join(out, "tokenizer_config.json"), {
        "added_tokens_decoder": decoder_of(tok), "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "padding_side": "left", "truncation_side": "left", "tokenizer_class": "TokenizersBackend"})
    with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(templates["qwen3_later"])


def make_fallback(out, templates):
    from tokenizers import Tokenizer, Regex, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.NFD()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated")
    ascii_only = [t for t in corpus() if all(ord(c) < 128 for c in t)]
    bytes_ = [f"<0x{b:02X}>" for b in range(256) if not (0x41 <= b <= 0x5A)]  # no bytes of A-Z: unk for some
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]",
                                                                  "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"] + bytes_,
                                  limit_alphabet=60, show_progress=False)
    tok.train_from_iterator(ascii_only, trainer)
    os.makedirs(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    dump(os.path.join(out, "tokenizer_config.json"), {
        "added_tokens_decoder": decoder_of(tok), "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<pad>", "tokenizer_class": "PreTrainedTokenizerFast"})
    with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(templates["mistral3"].replace("\n    ", "\n  "))  # re-indented: still the known template


# name -> (class for the tokenizer, caller)
FIXTURES = {
    "qwen3": ("Qwen2TokenizerFast", "tokenizer", make_qwen3),
    "mistral3": ("PixtralProcessor", "processor", make_mistral3),
    "generic": ("", "tokenizer", make_generic),
    "fallback": ("", "processor", make_fallback),
}


# ---- transformers' side -----------------------------------------------------------------

def load_tokenizer(path, cls):
    import transformers
    if cls == "Qwen2TokenizerFast":
        return transformers.Qwen2TokenizerFast.from_pretrained(path)
    if cls in ("PixtralProcessor", "AutoProcessor"):
        # What PixtralProcessor.from_pretrained loads (processing_utils.py, _get_arguments_from_pretrained):
        # TokenizersBackend from tokenizer.json whatever tokenizer_config.json's tokenizer_class says.
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
        return TokenizersBackend.from_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path)


# The tokenizer_config.json the hub's Mistral-Small-3.1 processor folders carry (FLUX.2 [dev]'s
# tokenizer folder comes from there): tokenizer_class LlamaTokenizerFast with its add_bos_token /
# add_eos_token / legacy, or the names transformers' own saves write.
HUB_PIXTRAL_CLASSES = {
    "LlamaTokenizerFast": {"add_bos_token": True, "add_eos_token": False, "legacy": True},
    "PreTrainedTokenizerFast": {},
    "TokenizersBackend": {},
}


def pixtral_variants(tmp):
    """The mistral3 fixture with each hub class name: loaded through PixtralProcessor (model_index.json)
    and AutoProcessor (processor_config.json says PixtralProcessor), plus the same folder through
    AutoTokenizer, which really builds LlamaTokenizer and stays refused. (folders, refused folders)"""
    folders, refused = [], []
    for cls, extra in HUB_PIXTRAL_CLASSES.items():
        d = os.path.join(tmp, f"pixtral_{cls}")
        shutil.copytree(os.path.join(DATA, "mistral3"), d)
        cfg_path = os.path.join(d, "tokenizer_config.json")
        cfg = json.load(open(cfg_path, encoding="utf-8"))
        cfg.update({"tokenizer_class": cls, **extra})
        dump(cfg_path, cfg)
        folders.append({"name": f"pixtral_{cls}", "path": d, "class": "PixtralProcessor", "caller": "processor"})
        folders.append({"name": f"autoprocessor_{cls}", "path": d, "class": "AutoProcessor", "caller": "processor"})
        if cls == "LlamaTokenizerFast":
            refused.append({"name": f"autotokenizer_{cls}", "path": d, "class": "", "caller": "processor"})
    return folders, refused


def processor_template(path):
    p = os.path.join(path, "processor_config.json")
    if os.path.exists(p):
        t = json.load(open(p, encoding="utf-8")).get("chat_template")
        if t is not None:
            return t
    p = os.path.join(path, "chat_template.json")
    if os.path.exists(p):
        return json.load(open(p, encoding="utf-8"))["chat_template"]
    return open(os.path.join(path, "chat_template.jinja"), encoding="utf-8").read()


def dev_messages(prompt):
    # diffusers pipeline_flux2.format_input
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    return [{"role": "system", "content": [{"type": "text", "text": SYSTEM_MESSAGE}]},
            {"role": "user", "content": [{"type": "text", "text": prompt.replace("[IMG]", "")}]}]


def processor_chat(tok, template, prompt, n):
    """ProcessorMixin.apply_chat_template(tokenize=True, padding="max_length", truncation=True, max_length=n)."""
    from transformers.utils.chat_template_utils import render_jinja_template
    kwargs = {**tok.special_tokens_map, "padding": "max_length", "truncation": True, "max_length": n}
    rendered, _ = render_jinja_template(conversations=[dev_messages(prompt)], chat_template=template,
                                        add_generation_prompt=False, **kwargs)
    text = rendered[0]
    add_special = not (tok.bos_token is not None and text.startswith(tok.bos_token))
    return text, tok([text], padding="max_length", truncation=True, max_length=n, add_special_tokens=add_special)


def klein_chat(tok, prompt, n):
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    return text, tok(text, padding="max_length", truncation=True, max_length=n)


def compact(ids, mask, pad_id, n):
    assert len(ids) == n and len(mask) == n, (len(ids), n)
    real = [i for i, m in zip(ids, mask) if m]
    k = len(real)
    left = k < n and mask[0] == 0
    assert mask == ([0] * (n - k) + [1] * k if left else [1] * k + [0] * (n - k)), "mask is not one block"
    assert all(i == pad_id for i, m in zip(ids, mask) if not m)
    return {"real": real, "pad": pad_id, "left": left}


def real_processor(path):
    """transformers' own PixtralProcessor, or None where it cannot load (it requires torchvision)."""
    import transformers
    if not os.path.exists(os.path.join(path, "processor_config.json")):
        return None
    try:
        p = transformers.AutoProcessor.from_pretrained(path, local_files_only=True)
    except ImportError:
        return None
    assert type(p).__name__ == "PixtralProcessor", type(p).__name__
    return p


def transformers_results(path, cls, caller, prompts, lengths, real=None):
    tok = load_tokenizer(path, cls)
    template = processor_template(path) if caller == "processor" else None
    results, texts = [], []
    for prompt in prompts:
        r = {"plain": tok(prompt, add_special_tokens=False)["input_ids"], "special": tok(prompt)["input_ids"]}
        for n in lengths:
            e = tok(prompt, padding="max_length", truncation=True, max_length=n)
            r[f"padded_{n}"] = compact(e["input_ids"], e["attention_mask"], tok.pad_token_id, n)
            if caller == "processor":
                text, e = processor_chat(tok, template, prompt, n)
                r[f"chat_{n}"] = compact(e["input_ids"][0], e["attention_mask"][0], tok.pad_token_id, n)
                if real is not None:  # the processor itself, as diffusers calls it
                    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
                    p = real.apply_chat_template(format_input([prompt]), add_generation_prompt=False, tokenize=True,
                                                 return_dict=True, return_tensors="pt", padding="max_length",
                                                 truncation=True, max_length=n)
                    got = compact(p["input_ids"][0].tolist(), p["attention_mask"][0].tolist(), tok.pad_token_id, n)
                    assert got == r[f"chat_{n}"], f"PixtralProcessor differs from its steps on {prompt!r}"
            else:
                text, e = klein_chat(tok, prompt, n)
                r[f"chat_{n}"] = compact(e["input_ids"], e["attention_mask"], tok.pad_token_id, n)
        texts.append(text)
        results.append(r)
    return {"vocab_size": max(tok.get_vocab().values()) + 1, "results": results, "chat_texts": texts}


def regen():
    templates = template_texts()
    if os.path.isdir(DATA):
        shutil.rmtree(DATA)
    os.makedirs(DATA)
    folders = []
    for name, (cls, caller, make) in FIXTURES.items():
        make(os.path.join(DATA, name), templates)
        got = transformers_results(os.path.join(DATA, name), cls, caller, PROMPTS, [512, 16])
        folders.append({"name": name, "class": cls, "caller": caller, **got})
    dump(os.path.join(DATA, "cases.json"), {"prompts": PROMPTS, "lengths": [512, 16], "folders": folders}, indent=None)
    print(f"wrote {len(folders)} folders and cases.json to {DATA}")


# ---- the check --------------------------------------------------------------------------

def fuzz_prompts(count, seed=1234):
    rng = random.Random(seed)
    pool = (list("abcXYZ019 _-'.,!?/\\\"") + ["  ", "\n", "\t", "\r\n", "\u3000", "\u00a0", "\u0085", "\u2028"] +
            list("東京狐狸한국مرحباΩſK\u212aǅ") + ["e\u0301", "\u0308", "\u200d", "\ufe0f", "👩‍👧", "🦊", "１２", "ﬁ"] +
            ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "[INST]", "[IMG]", "<think>", "<mid>", "<word>", "'s",
             "'LL", "123456", "\x00", "\x7f"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def template_variants():
    """Variants of the known templates: (name, kind of the original, text). Some render the same as
    the original (indentation, quotes, spaces in tags, comments, CRLF, trailing newline), some differ."""
    out = []
    for name, text in template_texts().items():
        kind = "qwen3" if name.startswith("qwen3") else "mistral3"
        q = "'<|im_start|>'" if kind == "qwen3" else "'[INST]'"
        edits = [
            ("same", text), ("reindent", text.replace("\n    ", "\n\t\t")), ("dedent", text.replace("\n    ", "\n")),
            ("tag spaces", text.replace("{%- if", "{%-   if").replace(" %}", "  %}")),
            ("quotes", text.replace(q, '"' + q[1:-1] + '"')), ("comment", "{# a comment #}\n" + text),
            ("crlf", text.replace("\n", "\r\n")), ("trailing newline", text + "\n"),
            ("two trailing newlines", text + "\n\n"), ("escape form", text.replace("'\\n'", "'\\x0a'")),
            ("drop a dash", text.replace("{{- '<|im_start|>assistant", "{{ '<|im_start|>assistant")
             .replace("{{- bos_token", "{{ bos_token")),
            ("changed literal", text.replace("[/INST]", "[/INST] ").replace("</think>\\n\\n'", "</think>\\n'")),
            ("leading text", "X" + text), ("leading newline", "\n" + text),
            ("trailing text", text + "\n{{- 'X' }}"), ("indent before output", text.replace("{{- '[SYSTEM_PROMPT]'", "  {{ '[SYSTEM_PROMPT]'")),
        ]
        out += [(f"{name}: {e}", kind, t) for e, t in edits]
    return out


def render_variant(text, kind):
    from transformers.utils.chat_template_utils import render_jinja_template
    texts = []
    for p in ["a cat", "", "x\n y <s>"]:
        try:
            if kind == "qwen3":
                r, _ = render_jinja_template([[{"role": "user", "content": p}]], chat_template=text,
                                             add_generation_prompt=True, enable_thinking=False)
            else:
                r, _ = render_jinja_template([dev_messages(p)], chat_template=text, add_generation_prompt=False,
                                             bos_token="<s>", eos_token="</s>")
            texts.append(r[0])
        except Exception as e:  # a template that fails is not the same template
            texts.append(f"error: {e}")
    return texts


def run_tprun(binary, env_name, value, test):
    env = dict(os.environ)
    env[env_name] = value
    p = subprocess.run([binary, f"--gtest_filter={test}"], env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or "[  PASSED  ] 1 test" not in p.stdout:
        print(p.stdout[-4000:], p.stderr[-4000:])
        sys.exit(f"{test} failed")


def check(binary):
    failures = []
    cases = json.load(open(os.path.join(DATA, "cases.json"), encoding="utf-8"))
    # 1. The fixtures' expected ids are still transformers' ids.
    for f in cases["folders"]:
        got = transformers_results(os.path.join(DATA, f["name"]), f["class"], f["caller"], cases["prompts"],
                                   cases["lengths"])
        for key in ("vocab_size", "results", "chat_texts"):
            if got[key] != f[key]:
                failures.append(f"cases.json {f['name']}: {key} differs from this venv's transformers (rerun --regen)")

    with tempfile.TemporaryDirectory() as tmp:
        # 2. tprun's own folders.
        run_tprun(binary, "TPRUN_HF_TOKENIZER_WRITE", tmp, "HfTokenizerFiles.WriteForParity")
        sizes = json.load(open(os.path.join(tmp, "written_sizes.json")))
        import transformers
        q = transformers.AutoTokenizer.from_pretrained(os.path.join(tmp, "written_qwen3"), local_files_only=True)
        if type(q).__name__ != "Qwen2Tokenizer":
            failures.append(f"AutoTokenizer on tprun's Qwen3 folder gave {type(q).__name__}")
        try:
            proc = transformers.AutoProcessor.from_pretrained(os.path.join(tmp, "written_mistral3"), local_files_only=True)
            print(f"AutoProcessor on tprun's Mistral-3 folder: {type(proc).__name__}")
            if type(proc).__name__ != "PixtralProcessor":
                failures.append(f"AutoProcessor gave {type(proc).__name__}")
        except ImportError as e:
            print(f"AutoProcessor on tprun's Mistral-3 folder: not checked here ({str(e).strip().splitlines()[0]})")

        folders = [{"name": f["name"], "path": os.path.join(DATA, f["name"]), "class": f["class"], "caller": f["caller"]}
                   for f in cases["folders"]]
        folders += [{"name": "written_qwen3", "path": os.path.join(tmp, "written_qwen3"), "class": "Qwen2TokenizerFast",
                     "caller": "tokenizer"},
                    {"name": "written_mistral3", "path": os.path.join(tmp, "written_mistral3"), "class": "PixtralProcessor",
                     "caller": "processor"}]
        variants_pixtral, refused = pixtral_variants(tmp)
        folders += variants_pixtral
        prompts = cases["prompts"] + fuzz_prompts(150)
        lengths = cases["lengths"]
        # 3. tprun's ids.
        request = os.path.join(tmp, "request.json")
        out = os.path.join(tmp, "tprun.json")
        variants = template_variants()
        dump(request, {"folders": folders + refused, "prompts": prompts, "lengths": lengths, "out": out,
                       "templates": [t for _, _, t in variants]}, indent=None)
        run_tprun(binary, "TPRUN_HF_TOKENIZER_DUMP", request, "HfTokenizerFiles.DumpForParity")
        mine = json.load(open(out, encoding="utf-8"))
        same = refused_same = 0
        for (label, kind, text), got in zip(variants, mine["_templates"]):
            renders_same = render_variant(text, kind) == render_variant(template_texts()[
                "mistral3" if kind == "mistral3" else "qwen3_later"], kind)
            if got is not None and (got != kind or not renders_same):
                failures.append(f"template variant '{label}' is recognised as {got} but renders differently")
            if got is None and renders_same:
                refused_same += 1
            same += renders_same
        print(f"{len(variants)} template variants: {same} render like a known template "
              f"({same - refused_same} recognised, {refused_same} refused conservatively), "
              f"{len(variants) - same} render differently (all refused unless listed below)")
        for f in refused:  # AutoTokenizer on LlamaTokenizerFast builds LlamaTokenizer: tprun must refuse
            import transformers
            built = type(transformers.AutoTokenizer.from_pretrained(f["path"])).__name__
            err = mine[f["name"]].get("error", "")
            if "is not a class tprun implements" not in err:
                failures.append(f"{f['name']}: AutoTokenizer builds {built}; tprun should refuse, got {err or 'ids'}")
            else:
                print(f"{f['name']}: refused as expected (AutoTokenizer builds {built})")
        compared = 0
        with_processor = []
        for f in folders:
            real = real_processor(f["path"]) if f["caller"] == "processor" else None
            if real is not None:
                with_processor.append(f["name"])
            theirs = transformers_results(f["path"], f["class"], f["caller"], prompts, lengths, real)
            ours = mine[f["name"]]
            if "error" in ours:
                failures.append(f"{f['name']}: tprun refused the folder: {ours['error']}")
                continue
            if f["name"] in sizes and sizes[f["name"]] != theirs["vocab_size"]:
                failures.append(f"{f['name']}: writer returned {sizes[f['name']]}, transformers has {theirs['vocab_size']}")
            if ours["vocab_size"] != theirs["vocab_size"]:
                failures.append(f"{f['name']}: vocab_size {ours['vocab_size']} vs {theirs['vocab_size']}")
            for k, prompt in enumerate(prompts):
                t, o = theirs["results"][k], ours["results"][k]
                for key in t:
                    want = t[key]
                    got = o[key]
                    if isinstance(want, dict):
                        got = {"real": got["real"], "pad": want["pad"], "left": want["left"]}
                        n = int(key.split("_")[1])
                        mine_ids = o[key]["ids"]
                        exp = ([want["pad"]] * (n - len(want["real"])) + want["real"]) if want["left"] else \
                            (want["real"] + [want["pad"]] * (n - len(want["real"])))
                        if mine_ids != exp:
                            got = {"ids": mine_ids}
                    if got != want:
                        failures.append(f"{f['name']} prompt {k} {key}: {prompt!r}\n  transformers {want}\n  tprun        {got}")
                if theirs["chat_texts"][k] != ours["chat_texts"][k]:
                    failures.append(f"{f['name']} prompt {k} chat text: {theirs['chat_texts'][k]!r} vs {ours['chat_texts'][k]!r}")
                compared += 1
    print("real PixtralProcessor checked on: " + (", ".join(with_processor) or "none (torchvision is not installed)"))
    for line in failures[:40]:
        print("FAIL", line)
    print(f"{compared} folder x prompt cases compared ({len(folders)} folders x {len(prompts)} prompts; plain, "
          f"with special tokens, padded/truncated at {lengths}, chat at {lengths}): "
          f"{'all exact' if not failures else f'{len(failures)} differences'}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--regen":
        regen()
    elif len(sys.argv) == 2:
        sys.exit(check(sys.argv[1]))
    else:
        sys.exit(__doc__)
