#pragma once
// What the CLIP and T5 tokenizers share: the output of one encode call, the
// added (special) tokens a tokenizer folder's tokenizer_config.json declares
// and transformers' splitting of a prompt on them, UTF-8 helpers, and the
// truncate + special tokens + pad step.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/added_token_trie.h"

namespace tprun::text {

// One prompt, tokenized the way FluxPipeline calls the tokenizer
// (padding="max_length", truncation=True, add_special_tokens=True).
struct TokenizerOutput {
  std::vector<int64_t> input_ids;       // max_length ids
  std::vector<int64_t> attention_mask;  // 1 up to and including the last special token, then 0
  int64_t untruncated_length = 0;       // ids with special tokens, before truncation and padding
};

// An entry of tokenizer_config.json's "added_tokens_decoder".
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool lstrip = false;
  bool rstrip = false;
};

// One piece of a prompt after splitting on the added tokens.
struct TextPiece {
  std::string text;
  const AddedToken* token = nullptr;  // set when the piece is an added token
};

// A tokenizer folder's optional JSON file (tokenizer_config.json, ...): an
// empty object when absent; CheckpointError naming the file when not an object.
nlohmann::json read_optional_json(const std::string& path, const std::string& what);
// A tokenizer folder's JSON file (tokenizer.json, a chat template) of at most
// HfTokenizerLimits::kMaxFileBytes (hf_bpe.h), its size checked before it is
// read: CheckpointError naming the file otherwise.
nlohmann::json read_bounded_json(const std::string& path, const std::string& what);

// Reads "added_tokens_decoder" of a parsed tokenizer_config.json (`file`
// names it in errors). Throws CheckpointError on malformed entries.
std::vector<AddedToken> parse_added_tokens(const nlohmann::json& config, const std::string& file);

// The string of a special token entry ("<pad>" or {"content": "<pad>", ...})
// under `key` in `special_tokens_map.json`, else in `tokenizer_config.json`;
// empty when neither names it. Throws CheckpointError when it is not a string.
std::string special_token_string(const nlohmann::json& special_map, const std::string& map_file,
                                 const nlohmann::json& config, const std::string& config_file,
                                 const std::string& key);

// The trie of `tokens`' contents (index = position in `tokens`), built once
// when a tokenizer loads.
AddedTokenTrie added_token_trie(const std::vector<AddedToken>& tokens);

// transformers' PreTrainedTokenizer.tokenize split: the added tokens found in
// `text` (leftmost, longest; `trie` = added_token_trie(tokens)) become their
// own pieces; lstrip/rstrip strip the whitespace next to them; empty pieces
// are dropped.
std::vector<TextPiece> split_on_added_tokens(const std::string& text, const std::vector<AddedToken>& tokens,
                                             const AddedTokenTrie& trie);

// The content ids of a prompt (no special tokens added, no truncation):
// RequestError for invalid UTF-8; the added tokens found in the prompt become
// their ids, every other piece goes through `encode_text(text, ids)`, which
// appends that piece's ids.
template <typename EncodeText>
std::vector<int64_t> content_ids_with(const std::string& prompt, const std::vector<AddedToken>& added,
                                      const AddedTokenTrie& trie, EncodeText encode_text);

// UTF-8 <-> code points. decode_utf8 throws RequestError naming `what` on
// invalid UTF-8.
std::u32string decode_utf8(const std::string& text, const std::string& what);
std::string encode_utf8(const std::u32string& text);
void append_utf8(std::string& out, char32_t c);

// Python's str.isspace() for one code point.
bool is_python_space(char32_t c);

// Truncates `content` (ids without special tokens) to max_length -
// `num_special` ids, lets `add_special` add the special tokens, and pads to
// max_length with `pad_id`.
template <typename AddSpecial>
TokenizerOutput finish_encoding(std::vector<int64_t> content, int64_t max_length, int64_t num_special,
                                int64_t pad_id, AddSpecial add_special) {
  TokenizerOutput out;
  out.untruncated_length = static_cast<int64_t>(add_special(content).size());
  const int64_t total = static_cast<int64_t>(content.size()) + num_special;
  if (total > max_length) content.resize(static_cast<size_t>(max_length - num_special));
  out.input_ids = add_special(content);
  out.attention_mask.assign(out.input_ids.size(), 1);
  while (static_cast<int64_t>(out.input_ids.size()) < max_length) {
    out.input_ids.push_back(pad_id);
    out.attention_mask.push_back(0);
  }
  return out;
}

template <typename EncodeText>
std::vector<int64_t> content_ids_with(const std::string& prompt, const std::vector<AddedToken>& added,
                                      const AddedTokenTrie& trie, EncodeText encode_text) {
  decode_utf8(prompt, "prompt");
  std::vector<int64_t> ids;
  for (const auto& piece : split_on_added_tokens(prompt, added, trie)) {
    if (piece.token) {
      ids.push_back(piece.token->id);
    } else {
      encode_text(piece.text, ids);
    }
  }
  return ids;
}

}  // namespace tprun::text
