#pragma once
// Tokenizer folders of the FLUX.2 text encoders that tprun makes itself
// (`tprun init-model --arch flux2-klein | flux2-dev`): a byte-level BPE
// learned from a text corpus, written as transformers 5 loads it unchanged and
// offline, and as text::HfTokenizer (hf_tokenizer.h) reads it:
//
//  - write_qwen3_tokenizer: Qwen3's layout (Flux2KleinPipeline "tokenizer",
//    Qwen2TokenizerFast): tokenizer.json (NFC, Qwen2's split regex,
//    ByteLevel, BPE, ByteLevel post-processor), vocab.json, merges.txt,
//    tokenizer_config.json with Qwen3's 26 added tokens (<|endoftext|> =
//    <pad>, <|im_start|>, <|im_end|> = eos, ..., <think>, </think>; ids right
//    after the BPE vocabulary, as in Qwen3) and Qwen3's chat template.
//  - write_mistral3_tokenizer: Mistral-Small-3.x's layout for a
//    PixtralProcessor (Flux2Pipeline "tokenizer"): tokenizer.json (the tekken
//    split regex, ByteLevel, BPE with ignore_merges, TemplateProcessing that
//    prepends <s>), the special tokens first (<unk>=0, <s>=1, </s>=2, [INST],
//    [/INST], ..., [IMG]=10, <pad>=11, [IMG_BREAK], [IMG_END], ...,
//    [SYSTEM_PROMPT]=17, [/SYSTEM_PROMPT]=18, then <SPECIAL_n> up to
//    `num_special` ids), tokenizer_config.json (TokenizersBackend),
//    special_tokens_map.json, processor_config.json,
//    preprocessor_config.json (PixtralImageProcessor) and
//    chat_template.jinja (the mistral3 processor template).
// Every file is written atomically; existing files are not overwritten.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tprun::presets {

// Pre-tokenizer regexes: Qwen2/Qwen3's, and Mistral tekken's (as the FLUX.2-dev
// tokenizer.json and transformers' fix_mistral_regex carry it).
extern const char* const kQwen2SplitPattern;
extern const char* const kTekkenSplitPattern;

// A byte-level BPE: the 256 byte symbols (GPT-2's bytes_to_unicode, in its
// order: "!" first, "Ġ" = space), then one token per merge.
struct ByteLevelBpe {
  std::vector<std::string> tokens;  // by rank (id = rank, before any offset)
  std::vector<std::pair<std::string, std::string>> merges;
};

// Learns at most `num_merges` merges from `texts`, pre-tokenized with
// `split_pattern` (text::SplitRegex, behavior Isolated) into byte symbols; the most
// frequent adjacent pair is merged until none occurs twice. Ties go to the
// smallest pair (byte order), so the result depends on the text alone.
// ConfigError for a bad pattern or a negative count, RequestError for invalid
// UTF-8 text.
ByteLevelBpe train_byte_level_bpe(const std::vector<std::string>& texts, const std::string& split_pattern,
                                  int64_t num_merges);

// ConfigError naming `dir` unless `bpe` is 256 byte tokens + one per merge,
// each token once.
void check_byte_level_bpe(const std::string& dir, const ByteLevelBpe& bpe);
// merges.txt: "#version: 0.2", then one "a b" merge per line.
std::string merges_txt(const ByteLevelBpe& bpe);

// An added token of a Qwen tokenizer, and whether it is special.
struct QwenAddedToken {
  const char* content;
  bool special;
};
// The added tokens every Qwen2-style tokenizer carries, in id order (Qwen2.5-VL's
// 22: <|endoftext|> .. <|video_pad|> special, <tool_call> .. <|file_sep|> not);
// Qwen3 appends four more.
const std::vector<QwenAddedToken>& qwen2_added_tokens();
// Qwen2Tokenizer's tokenizer_config.json for `added` with ids from `first_id`
// (added_tokens_decoder; additional_special_tokens = the special ones but
// <|endoftext|>, which is the pad token; eos <|im_end|>; no bos or unk).
nlohmann::json qwen2_tokenizer_config(const std::vector<QwenAddedToken>& added, int64_t first_id,
                                      int64_t model_max_length);

// Writes a Qwen3-style tokenizer/ folder; returns the vocabulary size (largest
// id + 1; the Qwen3 text encoder's vocab_size must be >= it).
int64_t write_qwen3_tokenizer(const std::string& dir, const ByteLevelBpe& bpe, int64_t model_max_length = 131072);

// Writes a Mistral-Small-3.x / Pixtral processor folder with `num_special`
// (>= 20) special tokens before the byte tokens; returns the vocabulary size.
int64_t write_mistral3_tokenizer(const std::string& dir, const ByteLevelBpe& bpe, int64_t num_special = 32,
                                 int64_t model_max_length = 131072);

}  // namespace tprun::presets
