#pragma once
// The "BPE" model of a tokenizer.json, as the tokenizers library runs it
// (models/bpe: merge_word + Word::merge_all, no dropout): each character of a
// pre-tokenized piece is a symbol (unknown characters go to byte-fallback
// <0xXX> tokens, else the unk token, else are dropped, as tokenizers does);
// then BpeMerges (bpe_merges.h) merges them. With ignore_merges a piece that
// is itself a vocabulary token is that token.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/bpe_merges.h"

namespace tprun::text {

// Limits on what a tokenizer.json may declare (checked before allocating).
struct HfTokenizerLimits {
  static constexpr int64_t kMaxVocab = 1 << 22;          // vocabulary entries
  static constexpr int64_t kMaxMerges = 1 << 22;         // merges
  static constexpr int64_t kMaxTokenBytes = 4096;        // one token's UTF-8 length
  static constexpr int64_t kMaxAddedTokens = 1 << 20;    // added tokens
  static constexpr int64_t kMaxId = (int64_t{1} << 31) - 1;
  static constexpr int64_t kMaxFileBytes = int64_t{64} << 20;  // tokenizer.json (Qwen3's: 11 MiB)
};

class BpeModel {
 public:
  // Parses tokenizer.json's "model" object (`file` names it in errors).
  // Throws CheckpointError naming file and field for a malformed or hostile
  // model, and for options tprun does not implement (dropout,
  // continuing_subword_prefix, end_of_word_suffix).
  static BpeModel from_json(const nlohmann::json& model, const std::string& file);

  // Appends the ids of one pre-tokenized piece (UTF-8, non-empty).
  void tokenize(const std::string& piece, std::vector<int64_t>& ids) const;

  // The id of a vocabulary token, or -1.
  int64_t token_id(const std::string& token) const;
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  int64_t max_id() const { return max_id_; }

  bool byte_fallback() const { return byte_fallback_; }
  bool ignore_merges() const { return ignore_merges_; }
  bool has_unk() const { return unk_id_ >= 0; }
  bool fuse_unk() const { return fuse_unk_; }

 private:
  // from_json's steps.
  static void check_options(const nlohmann::json& model, const std::string& file);
  void read_vocab(const nlohmann::json& model, const std::string& file);
  void read_unk(const nlohmann::json& model, const std::string& file);
  void read_merges(const nlohmann::json& model, const std::string& file);
  // One symbol per character of `piece`, before any merge.
  std::vector<uint32_t> initial_symbols(const std::string& piece) const;

  std::unordered_map<std::string, uint32_t> vocab_;
  BpeMerges merges_;
  int64_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int64_t max_id_ = -1;
  uint32_t byte_token_[256] = {};  // <0xXX> ids (byte_fallback)
  bool has_byte_token_[256] = {};
};

}  // namespace tprun::text
