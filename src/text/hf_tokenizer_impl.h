#pragma once
// Internals of HfTokenizer shared by hf_tokenizer_load.cpp (reading a folder)
// and hf_tokenizer.cpp (encoding). Not for other users.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  bool split_special_tokens = false;
  std::optional<std::string> bos_token, pad_token;
  std::optional<int64_t> pad_id;
  bool pad_left = false;
  bool truncate_left = false;
  std::optional<HfChatTemplateSource> tokenizer_chat_template, processor_chat_template;
  std::vector<std::string> byte_symbols;  // ByteLevel's byte -> symbol (UTF-8)

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

// hf_tokenizer_load.cpp: reads and checks the folder.
std::shared_ptr<HfTokenizer::Impl> load_hf_tokenizer(const std::string& folder, const std::string& transformers_class);

}  // namespace tprun::text
