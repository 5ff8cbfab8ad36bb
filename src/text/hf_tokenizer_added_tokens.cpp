// The added tokens of a tokenizer folder as transformers 5 ends up with them:
// tokenizer.json "added_tokens", tokenizer_config.json "added_tokens_decoder",
// the named special tokens (bos_token, ..., additional_special_tokens) and the
// order transformers adds them in, which decides their ids. Then the tries
// that find them in a text (added_token_trie.h), built once here.

#include <algorithm>

#include <fmt/format.h>

#include "text/hf_tokenizer_impl.h"
#include "runtime/error.h"

namespace tprun::text {
using nlohmann::json;

namespace {

// What transformers / tokenizers do when adding tokens (AddedVocabulary::add_tokens):
// an identical token is skipped, a known content keeps its id, a new one takes the
// next id after the vocabulary (or after the largest added id beyond it).
class AddedTokenTable {
 public:
  explicit AddedTokenTable(const BpeModel& model) : model_(model) {}

  void add_batch(const std::vector<HfAddedToken>& tokens) {
    int64_t next_id = model_.vocab_size();
    if (!tokens_.empty()) {
      int64_t max_added = 0;
      for (const auto& t : tokens_) max_added = std::max(max_added, t.id);
      if (max_added >= model_.vocab_size() || model_.vocab_size() == 0) next_id = max_added + 1;
    }
    for (HfAddedToken token : tokens) {
      if (token.content.empty()) continue;
      auto it = std::find_if(tokens_.begin(), tokens_.end(), [&](const HfAddedToken& t) { return t.content == token.content; });
      if (it != tokens_.end() && it->same_flags(token)) continue;
      if (it != tokens_.end()) {
        token.id = it->id;
        *it = token;
        continue;
      }
      const int64_t vocab_id = model_.token_id(token.content);
      token.id = vocab_id >= 0 ? vocab_id : next_id++;
      tokens_.push_back(token);
    }
  }
  const HfAddedToken* find(const std::string& content) const {
    for (const auto& t : tokens_)
      if (t.content == content) return &t;
    return nullptr;
  }
  std::vector<HfAddedToken>& tokens() { return tokens_; }

 private:
  const BpeModel& model_;
  std::vector<HfAddedToken> tokens_;
};

HfAddedToken parse_added_entry(const json& e, const std::string& file, const std::string& where, bool require_all) {
  if (!e.is_object()) bad_field(file, where, "is not an object");
  HfAddedToken t;
  auto content = e.find("content");
  if (content == e.end() || !content->is_string() || content->get<std::string>().empty())
    bad_field(file, where + ".content", "is missing or not a non-empty string");
  t.content = content->get<std::string>();
  if (static_cast<int64_t>(t.content.size()) > HfTokenizerLimits::kMaxTokenBytes)
    bad_field(file, where + ".content", "is longer than the token limit");
  t.special = json_bool_field(e, "special", false, file, where);
  t.normalized = !t.special;  // tokenizers' AddedToken::from default
  for (auto [key, flag] : {std::pair<const char*, bool*>{"lstrip", &t.lstrip}, {"rstrip", &t.rstrip},
                           {"normalized", &t.normalized}, {"single_word", &t.single_word}}) {
    if (require_all && !e.contains(key)) bad_field(file, where + "." + key, "is missing");
    *flag = json_bool_field(e, key, *flag, file, where);
  }
  return t;
}

std::optional<std::string> token_string(const json& v, const std::string& file, const std::string& key) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  bad_field(file, key, "is neither a string, null nor {\"content\": string}");
}

// The added tokens a folder declares, with their ids.
struct DeclaredTokens {
  std::vector<HfAddedToken> file_tokens;     // tokenizer.json added_tokens, in file order
  std::vector<HfAddedToken> decoder_tokens;  // tokenizer_config.json added_tokens_decoder, by id
  bool has_decoder = false;
  std::vector<std::pair<HfAddedToken, std::string>> with_origin;  // each with where it was declared
};

DeclaredTokens read_declared_tokens(const HfFolderFiles& files) {
  const json& tokenizer_json = files.tokenizer_json;
  const json& config = files.config;
  const std::string& file = files.tokenizer_file;
  const std::string& config_file = files.config_file;
  DeclaredTokens declared;
  if (auto it = tokenizer_json.find("added_tokens"); it != tokenizer_json.end() && !it->is_null()) {
    if (!it->is_array()) bad_field(file, "added_tokens", "is not an array");
    if (static_cast<int64_t>(it->size()) > HfTokenizerLimits::kMaxAddedTokens) bad_field(file, "added_tokens", "has too many entries");
    for (size_t k = 0; k < it->size(); ++k) {
      const std::string where = fmt::format("added_tokens[{}]", k);
      HfAddedToken t = parse_added_entry((*it)[k], file, where, /*require_all=*/true);
      const auto& idv = (*it)[k].value("id", json());
      if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() > HfTokenizerLimits::kMaxId)
        bad_field(file, where + ".id", "is missing or not an id");
      t.id = idv.get<int64_t>();
      declared.file_tokens.push_back(t);
      declared.with_origin.emplace_back(t, fmt::format("{}: {}", file, where));
    }
  }
  declared.has_decoder = config.contains("added_tokens_decoder");
  if (!declared.has_decoder) return declared;
  const auto& dec = config["added_tokens_decoder"];
  if (!dec.is_object()) bad_field(config_file, "added_tokens_decoder", "is not an object");
  if (static_cast<int64_t>(dec.size()) > HfTokenizerLimits::kMaxAddedTokens) bad_field(config_file, "added_tokens_decoder", "has too many entries");
  for (const auto& [key, entry] : dec.items()) {
    const std::string where = fmt::format("added_tokens_decoder['{}']", key);
    HfAddedToken t = parse_added_entry(entry, config_file, where, /*require_all=*/false);
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || id < 0 || id > HfTokenizerLimits::kMaxId) bad_field(config_file, where, "key is not a token id");
    t.id = id;
    declared.decoder_tokens.push_back(t);
    declared.with_origin.emplace_back(t, fmt::format("{}: {}", config_file, where));
  }
  std::sort(declared.decoder_tokens.begin(), declared.decoder_tokens.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return declared;
}

// The named special tokens (bos_token ... mask_token) and the extra ones
// (additional_special_tokens, extra_special_tokens), as strings.
struct NamedTokens {
  std::vector<std::string> named, extras;
  std::optional<std::string> bos, pad;
  std::vector<std::pair<std::string, std::string>> origins;  // (content, where it was named)
};

NamedTokens read_named_tokens(const HfFolderFiles& files, bool has_decoder, bool qwen2) {
  NamedTokens names;
  // tokenizer_config.json (special_tokens_map.json only when there is no
  // added_tokens_decoder), then the class defaults.
  auto named = [&](const char* key, std::optional<std::string> fallback) -> std::optional<std::string> {
    std::optional<std::string> v = fallback;
    std::string origin = fmt::format("Qwen2Tokenizer's default {}", key);
    if (!has_decoder && files.special_map.contains(key)) {
      v = token_string(files.special_map[key], files.map_file, key);
      origin = fmt::format("{}: {}", files.map_file, key);
    } else if (files.config.contains(key)) {
      v = token_string(files.config[key], files.config_file, key);
      origin = fmt::format("{}: {}", files.config_file, key);
    }
    if (v) names.origins.emplace_back(*v, origin);
    return v;
  };
  const std::optional<std::string> endoftext = qwen2 ? std::optional<std::string>("<|endoftext|>") : std::nullopt;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    const std::string k = key;
    const bool has_default = qwen2 && (k == "eos_token" || k == "unk_token" || k == "pad_token");
    auto v = named(key, has_default ? endoftext : std::nullopt);
    if (v) names.named.push_back(*v);
    if (k == "bos_token") names.bos = v;
    if (k == "pad_token") names.pad = v;
  }
  if (!names.pad) {  // tokenizer.json's padding section supplies a default pad token
    if (auto p = files.tokenizer_json.find("padding"); p != files.tokenizer_json.end() && p->is_object() && p->contains("pad_token") && (*p)["pad_token"].is_string())
      names.pad = (*p)["pad_token"].get<std::string>();
  }
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    const json* src = nullptr;
    const bool from_map = !has_decoder && files.special_map.contains(key);
    if (from_map) src = &files.special_map[key];
    else if (files.config.contains(key)) src = &files.config[key];
    if (!src || src->is_null() || (src->is_object() && src->empty())) continue;
    if (!src->is_array())
      bad_field(files.config_file, key, "is not a list of tokens (model-specific named tokens are not implemented)");
    for (const auto& v : *src) {
      if (auto s = token_string(v, files.config_file, key)) {
        names.extras.push_back(*s);
        names.origins.emplace_back(*s, fmt::format("{}: {}", from_map ? files.map_file : files.config_file, key));
      }
    }
  }
  return names;
}

HfAddedToken default_special(const std::string& content) {
  HfAddedToken t;
  t.content = content;
  t.special = true;
  t.normalized = false;
  return t;
}

// The batches transformers adds, in its order (Tokenizer.from_file, the
// class's __init__, _post_init).
void add_in_transformers_order(AddedTokenTable& table, DeclaredTokens& declared, const NamedTokens& names, bool qwen2) {
  auto decoder_entry = [&](const std::string& content) -> const HfAddedToken* {
    for (const auto& t : declared.decoder_tokens)
      if (t.content == content) return &t;
    return nullptr;
  };
  if (!qwen2) table.add_batch(declared.file_tokens);  // Tokenizer.from_file
  if (qwen2 && !declared.has_decoder) {  // transformers' legacy path: tokenizer.json's added tokens, by id
    declared.decoder_tokens = declared.file_tokens;
    std::sort(declared.decoder_tokens.begin(), declared.decoder_tokens.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  }
  std::vector<HfAddedToken> first_batch = declared.decoder_tokens;
  for (const auto& s : names.named)
    if (!table.find(s) && !decoder_entry(s)) first_batch.push_back(default_special(s));
  for (const auto& s : names.extras)
    if (!table.find(s) && !decoder_entry(s)) first_batch.push_back(default_special(s));
  table.add_batch(first_batch);
  if (qwen2) {
    std::vector<HfAddedToken> again;
    for (const auto& s : names.named) again.push_back(default_special(s));
    for (const auto& s : names.extras) again.push_back(default_special(s));
    table.add_batch(again);
  }
  // _post_init: named tokens as their added_tokens_decoder entries, extra ones as plain specials.
  std::vector<HfAddedToken> post;
  for (const auto& s : names.named) post.push_back(decoder_entry(s) ? *decoder_entry(s) : default_special(s));
  for (const auto& s : names.extras) post.push_back(default_special(s));
  table.add_batch(post);
}

}  // namespace

void load_added_tokens(HfTokenizer::Impl& impl, const HfFolderFiles& files, bool qwen2) {
  DeclaredTokens declared = read_declared_tokens(files);
  const NamedTokens names = read_named_tokens(files, declared.has_decoder, qwen2);
  impl.bos_token = names.bos;
  impl.pad_token = names.pad;
  impl.config_file = files.config_file;
  impl.named_origins = names.origins;
  AddedTokenTable table(impl.model);
  add_in_transformers_order(table, declared, names, qwen2);
  for (const auto& [t, where] : declared.with_origin) {
    const HfAddedToken* got = table.find(t.content);
    if (got && got->id != t.id)
      throw CheckpointError(fmt::format("{}: '{}' is declared with id {}, but transformers gives it id {}; refusing "
                                        "an ambiguous vocabulary",
                                        where, t.content, t.id, got->id));
  }
  impl.added = table.tokens();
  for (size_t k = 0; k < impl.added.size(); ++k) {
    const HfAddedToken& t = impl.added[k];
    if (t.normalized) impl.normalized_added_trie.add(normalize_text(impl.normalizers, t.content), static_cast<int32_t>(k));
    else impl.raw_added_trie.add(t.content, static_cast<int32_t>(k));
  }
}

}  // namespace tprun::text
