#pragma once
// The tokenizer/ folder of a Qwen-Image pipeline that tprun makes itself
// (`tprun init-model` for the Qwen-Image family): the Qwen2.5-VL tokenizer in
// the layout the hub ships Qwen/Qwen-Image's tokenizer/ in, with no
// tokenizer.json, so that transformers 5 builds Qwen2Tokenizer from the files
// (text/hf_vocab_merges.h reads them the same way):
//
//  - vocab.json: the byte-level BPE (hf_tokenizer_files.h ByteLevelBpe), id =
//    rank;
//  - merges.txt: "#version: 0.2", then one "a b" merge per line;
//  - added_tokens.json: Qwen2.5-VL's 22 added tokens with the ids right after
//    the vocabulary, in Qwen's order: <|endoftext|> (pad), <|im_start|>,
//    <|im_end|> (eos), <|object_ref_start|>, <|object_ref_end|>,
//    <|box_start|>, <|box_end|>, <|quad_start|>, <|quad_end|>,
//    <|vision_start|>, <|vision_end|>, <|vision_pad|>, <|image_pad|>,
//    <|video_pad|> (special), then <tool_call>, </tool_call>, <|fim_prefix|>,
//    <|fim_middle|>, <|fim_suffix|>, <|fim_pad|>, <|repo_name|>,
//    <|file_sep|> (not special); none normalized, stripped or single-word;
//  - tokenizer_config.json: added_tokens_decoder for the same 22,
//    additional_special_tokens (<|im_start|> .. <|video_pad|>), bos_token and
//    unk_token null, eos_token <|im_end|>, pad_token <|endoftext|>,
//    add_bos_token / add_prefix_space / split_special_tokens /
//    clean_up_tokenization_spaces false, errors "replace", model_max_length
//    (131072 as Qwen2.5-VL's), tokenizer_class Qwen2Tokenizer; no
//    padding_side / truncation_side, so transformers' default (right) holds;
//  - special_tokens_map.json: additional_special_tokens, eos and pad;
//  - chat_template.jinja: Qwen2.5-VL's chat template.
// Every file is written atomically; existing files are not overwritten.

#include <cstdint>
#include <string>
#include <vector>

#include "presets/hf_tokenizer_files.h"

namespace tprun::presets {

// Writes the folder; returns the vocabulary size (largest id + 1; the
// Qwen2.5-VL text encoder's vocab_size must be >= it). ConfigError for a BPE
// that is not 256 byte tokens + one per merge, or a token given twice.
int64_t write_qwen25vl_tokenizer(const std::string& dir, const ByteLevelBpe& bpe, int64_t model_max_length = 131072);

// Qwen2.5-VL's 22 added tokens in id order, and whether each is special
// (qwen2_added_tokens: those every Qwen2-style tokenizer carries).
const std::vector<QwenAddedToken>& qwen25vl_added_tokens();

}  // namespace tprun::presets
