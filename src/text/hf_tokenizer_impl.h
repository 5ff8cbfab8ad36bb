#pragma once
// Internals of HfTokenizer shared by hf_tokenizer_load.cpp and
// hf_tokenizer_added_tokens.cpp (reading a folder) and hf_tokenizer.cpp
// (encoding). Not for other users.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/added_token_trie.h"
#include "text/chat_template.h"
#include "text/hf_bpe.h"
#include "text/hf_regex.h"
#include "text/hf_tokenizer.h"

namespace tprun::text {

// tokenizers' AddedToken with the id it ends up with.
struct HfAddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool single_word = false;

  bool same_flags(const HfAddedToken& o) const {
    return special == o.special && lstrip == o.lstrip && rstrip == o.rstrip && normalized == o.normalized &&
           single_word == o.single_word;
  }
};

enum class HfNormalizerKind { kNFC, kNFD, kNFKC, kNFKD };

struct HfPreTokenizerStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::optional<SplitRegex> regex;  // kSplit; kByteLevel with use_regex
  bool add_prefix_space = false;    // kByteLevel
};

// One TemplateProcessing (single sequence) of the post-processor: items are
// either the sequence ($A) or the ids of a special token.
struct HfTemplateStep {
  struct Item {
    bool sequence = false;
    std::vector<int64_t> ids;
  };
  std::vector<Item> items;
  int64_t added() const {
    int64_t n = 0;
    for (const auto& i : items) n += static_cast<int64_t>(i.ids.size());
    return n;
  }
};

struct HfChatTemplateSource {
  std::string file;  // where it was read, for messages
  std::string text;
  std::optional<ChatTemplateKind> kind;  // nullopt: not one tprun knows
};

struct HfTokenizer::Impl {
  std::string folder;
  std::string tokenizer_file;  // <folder>/tokenizer.json
  BpeModel model;
  std::vector<HfNormalizerKind> normalizers;
  std::vector<HfPreTokenizerStep> pre_tokenizers;
  std::vector<HfTemplateStep> post_processor;  // applied in order
  std::vector<HfAddedToken> added;             // one per content
  // Indexes into `added`, built once at load: the normalized=false contents as
  // they are, the others normalized (matched on the normalized text).
  AddedTokenTrie raw_added_trie, normalized_added_trie;
  bool split_special_tokens = false;
  std::optional<std::string> bos_token, pad_token;
  std::optional<int64_t> pad_id;
  std::string config_file;  // <folder>/tokenizer_config.json (for messages; it may be absent)
  // Each named special token (bos_token ... mask_token, extra tokens) with
  // where it was named ("<file>: pad_token", "Qwen2Tokenizer's default pad_token").
  std::vector<std::pair<std::string, std::string>> named_origins;
  bool pad_left = false;
  bool truncate_left = false;
  std::optional<HfChatTemplateSource> tokenizer_chat_template, processor_chat_template;

  int64_t special_tokens_added() const {
    int64_t n = 0;
    for (const auto& s : post_processor) n += s.added();
    return n;
  }
  std::optional<int64_t> added_id(const std::string& content) const {
    for (const auto& t : added)
      if (t.content == content) return t.id;
    return std::nullopt;
  }
};

// The JSON files of a tokenizer folder that loading reads, with their paths
// for messages (tokenizer_config.json and special_tokens_map.json are {} when
// absent).
struct HfFolderFiles {
  nlohmann::json tokenizer_json;
  std::string tokenizer_file;  // <folder>/tokenizer.json
  nlohmann::json config;       // tokenizer_config.json
  std::string config_file;
  nlohmann::json special_map;
  std::string map_file;
};

// hf_tokenizer_load.cpp: CheckpointError "<file>: <field> <what>".
[[noreturn]] void bad_field(const std::string& file, const std::string& field, const std::string& what);
// An optional boolean field `key` of `obj` (`where` is its parent, for messages).
bool json_bool_field(const nlohmann::json& obj, const char* key, bool fallback, const std::string& file,
                     const std::string& where);

// hf_tokenizer_added_tokens.cpp: the added tokens, bos / pad token strings and
// the added-token tries, as transformers builds them for the class (`qwen2`:
// Qwen2Tokenizer, else tokenizer.json as it is).
void load_added_tokens(HfTokenizer::Impl& impl, const HfFolderFiles& files, bool qwen2);

// hf_tokenizer.cpp: the normalizer sequence on one text (RequestError when ICU fails).
std::string normalize_text(const std::vector<HfNormalizerKind>& normalizers, const std::string& text);

// hf_tokenizer_load.cpp: reads and checks the folder.
std::shared_ptr<HfTokenizer::Impl> load_hf_tokenizer(const std::string& folder, const std::string& transformers_class);

}  // namespace tprun::text
