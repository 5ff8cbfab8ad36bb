#pragma once
// T5's SentencePiece tokenizer (transformers' slow T5Tokenizer, legacy=True,
// as FLUX.1's tokenizer_2/ configures it) through libsentencepiece:
// spiece.model, tokenizer_config.json, special_tokens_map.json. A prompt is
// split on the added tokens (<extra_id_n>, eos, unk, pad); each other piece
// goes through SentencePiece whole; eos is appended unless already last.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/tokenizer_common.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tprun::text {

class T5Tokenizer {
 public:
  // Throws CheckpointError naming the file for a missing or malformed file.
  explicit T5Tokenizer(const std::string& dir);
  ~T5Tokenizer();
  T5Tokenizer(const T5Tokenizer&) = delete;
  T5Tokenizer& operator=(const T5Tokenizer&) = delete;

  // Content ids (truncated to max_length - 1) + eos (unless the last id
  // already is eos), padded with the pad id to max_length. Throws
  // RequestError for invalid UTF-8 or a max_length below 1.
  TokenizerOutput encode(const std::string& prompt, int64_t max_length) const;
  // The content ids of a prompt: no eos, no truncation, no padding.
  std::vector<int64_t> content_ids(const std::string& prompt) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  // SentencePiece pieces plus the added tokens beyond them (<extra_id_N>).
  int64_t vocab_size() const { return vocab_size_; }

 private:
  int64_t token_id(const std::string& token) const;

  std::string dir_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<AddedToken> added_;
  AddedTokenTrie added_trie_;  // of added_, built at the end of the constructor
  int64_t eos_id_ = 1, pad_id_ = 0, unk_id_ = 2, vocab_size_ = 0;
};

}  // namespace tprun::text
