#pragma once
// CLIP's byte-level BPE tokenizer (transformers' slow CLIPTokenizer without
// ftfy), read from a diffusers tokenizer/ folder: vocab.json, merges.txt,
// tokenizer_config.json, special_tokens_map.json. the reference set shared/ref/TEXT.md
// "tokenizer (CLIP)" states the steps; clip_text_clean.h holds the text
// clean-up and the pre-tokeniser regex.

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/tokenizer_common.h"

namespace tprun::text {

class ClipTokenizer {
 public:
  // Throws CheckpointError naming the file for a missing or malformed file.
  explicit ClipTokenizer(const std::string& dir);

  // bos + content ids (truncated to max_length - 2) + eos, padded with the
  // pad token to max_length. Throws RequestError for invalid UTF-8 or a
  // max_length below 2.
  TokenizerOutput encode(const std::string& prompt, int64_t max_length = 77) const;
  // The content ids of a prompt: no bos/eos, no truncation, no padding.
  std::vector<int64_t> content_ids(const std::string& prompt) const;

  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t model_max_length() const { return model_max_length_; }
  size_t vocab_size() const { return vocab_.size(); }

 private:
  // The BPE symbols of one pre-tokenised word (already byte-mapped).
  std::vector<std::string> bpe(const std::string& word) const;
  int64_t token_id(const std::string& token) const;

  std::string dir_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, int64_t> merge_ranks_;  // "first second" -> rank
  std::vector<AddedToken> added_;
  std::string byte_symbol_[256];
  int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, unk_id_ = 0;
  int64_t model_max_length_ = 77;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::string>> cache_;
};

}  // namespace tprun::text
