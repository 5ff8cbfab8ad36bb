#pragma once
// The "BPE" model of a tokenizer.json, as the tokenizers library runs it
// (models/bpe: merge_word + Word::merge_all, no dropout): each character of a
// pre-tokenized piece is a symbol (unknown characters go to byte-fallback
// <0xXX> tokens, else the unk token, else are dropped, as tokenizers does);
// then the adjacent pair of lowest merge rank, leftmost first, is merged until
// none is left. With ignore_merges a piece that is itself a vocabulary token is
// that token.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

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
  struct Merge {
    uint32_t rank;
    uint32_t new_id;
  };
  static uint64_t pair_key(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

  std::unordered_map<std::string, uint32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  int64_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int64_t max_id_ = -1;
  uint32_t byte_token_[256] = {};  // <0xXX> ids (byte_fallback)
  bool has_byte_token_[256] = {};
};

}  // namespace tprun::text
