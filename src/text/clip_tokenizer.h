#pragma once
// CLIP's byte-level BPE tokenizer (transformers' CLIPTokenizer without ftfy),
// read from a diffusers tokenizer/ folder: vocab.json, merges.txt,
// tokenizer_config.json, special_tokens_map.json. A prompt is split on the
// added tokens; clip_text_clean.h cleans each other piece and splits it into
// words; each word becomes byte-level symbols (byte_level.h) with "</w>" on
// the last, merged by BpeMerges (bpe_merges.h) into tokens.

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/bpe_merges.h"
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
  // The constructor's steps.
  void read_vocab(const std::string& path);
  void read_merges(const std::string& path);
  void read_special_tokens(const std::string& config_path, const std::string& map_path,
                           const std::string& vocab_path);
  void map_symbols_to_tokens(const std::string& vocab_path);
  // The symbol id of a BPE symbol string (one more when it is new).
  uint32_t intern_symbol(const std::string& symbol);

  // The token ids of one pre-tokenised word (already byte-mapped).
  std::vector<int64_t> bpe(const std::string& word) const;
  int64_t token_id(const std::string& token) const;

  std::string dir_;
  std::unordered_map<std::string, int64_t> vocab_;
  // BPE runs on symbol ids: every byte symbol, with and without "</w>", and
  // every symbol merges.txt names; symbol_token_ maps them to token ids.
  std::unordered_map<std::string, uint32_t> symbol_ids_;
  std::vector<std::string> symbol_text_;
  std::vector<int64_t> symbol_token_;
  BpeMerges merges_;
  std::vector<AddedToken> added_;
  AddedTokenTrie added_trie_;  // of added_, built at the end of the constructor
  int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, unk_id_ = 0;
  int64_t model_max_length_ = 77;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace tprun::text
