#pragma once
// A tiny UMT5-style tokenizer folder for `tprun init-model` (Wan's
// tokenizer/), laid out as the hub's Wan-AI/Wan2.1-T2V-*-Diffusers
// tokenizer/ folder: spiece.model, tokenizer.json, tokenizer_config.json
// (class T5Tokenizer, extra_ids, the <extra_id_N> as added special tokens),
// special_tokens_map.json. Like UMT5's own SentencePiece model it is a
// unigram with <pad>=0 </s>=1 <unk>=2, nmt_nfkc normalization and byte
// fallback (the 256 <0xNN> pieces follow <unk>); the sentinels <extra_id_N>
// follow the pieces, <extra_id_0> last. transformers 5 loads it as
// T5TokenizerFast and tokenizes it as text::T5UnigramTokenizer does (no byte
// fallback: unknown characters are <unk>). model_max_length is 512 (the hub's
// is transformers' VERY_LARGE_INTEGER; WanPipeline always passes max_length).
// Files are written atomically; existing files are not overwritten.

#include <cstdint>
#include <string>
#include <vector>

namespace tprun::presets {

// Trains the unigram on `corpus` (at most `vocab_size` pieces, fewer when the
// text supports fewer; at least 300 for the byte pieces) and writes the folder
// `dir` (created if missing). Returns the tokenizer length, pieces +
// extra_ids: the least vocab_size a UMT5 text encoder for it may have.
// ConfigError when sentencepiece rejects the settings or the text.
int64_t write_umt5_tokenizer(const std::string& dir, const std::vector<std::string>& corpus, int vocab_size = 1000,
                             int extra_ids = 300);

}  // namespace tprun::presets
