// Reading a tokenizer folder into HfTokenizer::Impl: tokenizer.json's
// normalizer / pre_tokenizer / model / post_processor / added_tokens, the
// class transformers builds, tokenizer_config.json's added tokens, special
// tokens, sides and chat templates. See hf_tokenizer.h for what is accepted.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "checkpoint/strict_json.h"
#include "text/bpe_trainer.h"
#include "text/hf_tokenizer_impl.h"
#include "runtime/error.h"

namespace tprun::text {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Qwen2Tokenizer's pre-tokenizer regex (transformers models/qwen2/tokenization_qwen2.py).
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// ByteLevel's built-in regex (tokenizers pre_tokenizers/byte_level.rs).
const char* const kByteLevelPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void bad(const std::string& file, const std::string& field, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {} {}", file, field, what));
}

json read_bounded_json(const fs::path& path, const std::string& what) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot be read ({})", path.string(), ec.message()));
  if (static_cast<int64_t>(size) > HfTokenizerLimits::kMaxFileBytes)
    throw CheckpointError(fmt::format("{}: {} bytes, above the limit of {} for a {}", path.string(), size,
                                      HfTokenizerLimits::kMaxFileBytes, what));
  return checkpoint::read_json_file(path.string(), what);
}

std::string read_text(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size > (16u << 20)) throw CheckpointError(fmt::format("{}: cannot be read or larger than 16 MiB", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("{}: cannot be read", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool get_bool(const json& obj, const char* key, bool fallback, const std::string& file, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad(file, where + "." + key, fmt::format("is {}, not a boolean", it->dump()));
  return it->get<bool>();
}

std::string get_type(const json& obj, const std::string& file, const std::string& where) {
  if (!obj.is_object()) bad(file, where, "is not an object");
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) bad(file, where + ".type", "is missing or not a string");
  return it->get<std::string>();
}

// ---- normalizer / pre-tokenizer / post-processor ------------------------------

void parse_normalizer(const json& n, const std::string& file, const std::string& where,
                      std::vector<HfNormalizerKind>& out) {
  if (n.is_null()) return;
  const std::string type = get_type(n, file, where);
  if (type == "NFC") out.push_back(HfNormalizerKind::kNFC);
  else if (type == "NFD") out.push_back(HfNormalizerKind::kNFD);
  else if (type == "NFKC") out.push_back(HfNormalizerKind::kNFKC);
  else if (type == "NFKD") out.push_back(HfNormalizerKind::kNFKD);
  else if (type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) bad(file, where + ".normalizers", "is missing or not an array");
    if (it->size() > 64) bad(file, where + ".normalizers", "has more than 64 entries");
    for (size_t k = 0; k < it->size(); ++k)
      parse_normalizer((*it)[k], file, fmt::format("{}.normalizers[{}]", where, k), out);
  } else {
    bad(file, where + ".type", fmt::format("\"{}\" is not a normalizer tprun implements (NFC, NFD, NFKC, NFKD, Sequence)", type));
  }
}

SplitRegex compile_or_throw(const std::string& pattern, const std::string& file, const std::string& where) {
  try {
    return SplitRegex::compile(pattern);
  } catch (const std::invalid_argument& e) {
    bad(file, where, fmt::format("regex '{}' is outside what tprun implements: {}", pattern, e.what()));
  }
}

std::string escape_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string("\\^$.|?*+()[]{}-#&~ \t\n\r").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

void parse_pre_tokenizer(const json& p, const std::string& file, const std::string& where,
                         std::vector<HfPreTokenizerStep>& out) {
  if (p.is_null()) return;
  const std::string type = get_type(p, file, where);
  if (type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array()) bad(file, where + ".pretokenizers", "is missing or not an array");
    if (it->size() > 64) bad(file, where + ".pretokenizers", "has more than 64 entries");
    for (size_t k = 0; k < it->size(); ++k)
      parse_pre_tokenizer((*it)[k], file, fmt::format("{}.pretokenizers[{}]", where, k), out);
  } else if (type == "Split") {
    HfPreTokenizerStep step;
    step.kind = HfPreTokenizerStep::Kind::kSplit;
    auto pat = p.find("pattern");
    if (pat == p.end() || !pat->is_object() || pat->size() != 1)
      bad(file, where + ".pattern", "is not {\"Regex\": ...} or {\"String\": ...}");
    if (pat->contains("Regex") && (*pat)["Regex"].is_string())
      step.regex = compile_or_throw((*pat)["Regex"].get<std::string>(), file, where + ".pattern.Regex");
    else if (pat->contains("String") && (*pat)["String"].is_string() && !(*pat)["String"].get<std::string>().empty())
      step.regex = compile_or_throw(escape_literal((*pat)["String"].get<std::string>()), file, where + ".pattern.String");
    else
      bad(file, where + ".pattern", "is not {\"Regex\": string} or {\"String\": non-empty string}");
    auto behavior = p.find("behavior");
    if (behavior == p.end() || !behavior->is_string() || behavior->get<std::string>() != "Isolated")
      bad(file, where + ".behavior",
          fmt::format("is {}; tprun implements only \"Isolated\"", behavior == p.end() ? "missing" : behavior->dump()));
    if (get_bool(p, "invert", false, file, where))
      bad(file, where + ".invert", "is true; tprun implements only invert=false");
    out.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    HfPreTokenizerStep step;
    step.kind = HfPreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = get_bool(p, "add_prefix_space", true, file, where);
    if (get_bool(p, "use_regex", true, file, where)) step.regex = compile_or_throw(kByteLevelPattern, file, where);
    out.push_back(std::move(step));
  } else {
    bad(file, where + ".type", fmt::format("\"{}\" is not a pre-tokenizer tprun implements (Split, ByteLevel, Sequence)", type));
  }
}

void parse_post_processor(const json& p, const std::string& file, const std::string& where,
                          std::vector<HfTemplateStep>& out) {
  if (p.is_null()) return;
  const std::string type = get_type(p, file, where);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) bad(file, where + ".processors", "is missing or not an array");
    if (it->size() > 64) bad(file, where + ".processors", "has more than 64 entries");
    for (size_t k = 0; k < it->size(); ++k)
      parse_post_processor((*it)[k], file, fmt::format("{}.processors[{}]", where, k), out);
    return;
  }
  if (type != "TemplateProcessing")
    bad(file, where + ".type",
        fmt::format("\"{}\" is not a post-processor tprun implements (ByteLevel, TemplateProcessing, Sequence)", type));
  std::map<std::string, std::vector<int64_t>> specials;
  auto st = p.find("special_tokens");
  if (st != p.end() && !st->is_null()) {
    if (!st->is_object()) bad(file, where + ".special_tokens", "is not an object");
    for (const auto& [name, entry] : st->items()) {
      const std::string f = fmt::format("{}.special_tokens['{}'].ids", where, name);
      if (!entry.is_object() || !entry.contains("ids") || !entry["ids"].is_array() || entry["ids"].size() > 64)
        bad(file, f, "is missing or not an array of at most 64 ids");
      std::vector<int64_t> ids;
      for (const auto& id : entry["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > HfTokenizerLimits::kMaxId)
          bad(file, f, fmt::format("holds {}, not an id", id.dump()));
        ids.push_back(id.get<int64_t>());
      }
      specials[name] = std::move(ids);
    }
  }
  auto single = p.find("single");
  if (single == p.end() || !single->is_array() || single->size() > 64)
    bad(file, where + ".single", "is missing or not an array of at most 64 pieces");
  HfTemplateStep step;
  int sequences = 0;
  for (size_t k = 0; k < single->size(); ++k) {
    const auto& piece = (*single)[k];
    const std::string f = fmt::format("{}.single[{}]", where, k);
    if (piece.is_object() && piece.contains("Sequence") && piece["Sequence"].is_object()) {
      const auto& s = piece["Sequence"];
      if (!s.contains("id") || s["id"] != "A") bad(file, f, "is a sequence other than A (single sequences have only A)");
      step.items.push_back({true, {}});
      ++sequences;
    } else if (piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].is_object() &&
               piece["SpecialToken"].contains("id") && piece["SpecialToken"]["id"].is_string()) {
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      auto it = specials.find(name);
      if (it == specials.end()) bad(file, f, fmt::format("names the special token '{}', missing from special_tokens", name));
      step.items.push_back({false, it->second});
    } else {
      bad(file, f, fmt::format("is {}, not {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", piece.dump()));
    }
  }
  if (sequences != 1) bad(file, where + ".single", "does not hold the sequence $A exactly once");
  out.push_back(std::move(step));
}

// ---- added tokens -------------------------------------------------------------

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
  if (!e.is_object()) bad(file, where, "is not an object");
  HfAddedToken t;
  auto content = e.find("content");
  if (content == e.end() || !content->is_string() || content->get<std::string>().empty())
    bad(file, where + ".content", "is missing or not a non-empty string");
  t.content = content->get<std::string>();
  if (static_cast<int64_t>(t.content.size()) > HfTokenizerLimits::kMaxTokenBytes)
    bad(file, where + ".content", "is longer than the token limit");
  t.special = get_bool(e, "special", false, file, where);
  t.normalized = !t.special;  // tokenizers' AddedToken::from default
  for (auto [key, flag] : {std::pair<const char*, bool*>{"lstrip", &t.lstrip}, {"rstrip", &t.rstrip},
                           {"normalized", &t.normalized}, {"single_word", &t.single_word}}) {
    if (require_all && !e.contains(key)) bad(file, where + "." + key, "is missing");
    *flag = get_bool(e, key, *flag, file, where);
  }
  return t;
}

std::optional<std::string> token_string(const json& v, const std::string& file, const std::string& key) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  bad(file, key, "is neither a string, null nor {\"content\": string}");
}

std::optional<HfChatTemplateSource> chat_source(const std::string& file, std::string text) {
  HfChatTemplateSource s{file, std::move(text), std::nullopt};
  s.kind = recognize_chat_template(s.text);
  return s;
}

// A "chat_template" value: a string, or [{"name": ..., "template": ...}] (the "default" one).
std::optional<HfChatTemplateSource> chat_field(const json& obj, const std::string& file) {
  auto it = obj.find("chat_template");
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return chat_source(file + " (chat_template)", it->get<std::string>());
  if (it->is_array()) {
    for (const auto& e : *it)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return chat_source(file + " (chat_template 'default')", e["template"].get<std::string>());
    bad(file, "chat_template", "is a list of templates without one named \"default\"");
  }
  if (it->is_object() && it->contains("default") && (*it)["default"].is_string())
    return chat_source(file + " (chat_template 'default')", (*it)["default"].get<std::string>());
  bad(file, "chat_template", "is not a string or a list of named templates");
}

// The processor class AutoProcessor would build for the folder, as
// transformers' processing_auto.py looks for it: processor_config.json, then
// preprocessor_config.json, then tokenizer_config.json "processor_class";
// "" when none names one.
std::string processor_class_of(const fs::path& root, const json& tokenizer_config, const std::string& cfg_file) {
  auto named = [](const json& j, const std::string& file) -> std::optional<std::string> {
    auto it = j.find("processor_class");
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) bad(file, "processor_class", "is not a string");
    return it->get<std::string>();
  };
  for (const char* name : {"processor_config.json", "preprocessor_config.json"}) {
    const std::string file = (root / name).string();
    if (auto c = named(read_optional_json(file, name), file)) return *c;
  }
  return named(tokenizer_config, cfg_file).value_or("");
}

}  // namespace

std::shared_ptr<HfTokenizer::Impl> load_hf_tokenizer(const std::string& folder, const std::string& transformers_class) {
  const fs::path root(folder);
  if (!fs::is_directory(root)) throw CheckpointError(fmt::format("{}: tokenizer folder not found", folder));
  auto impl = std::make_shared<HfTokenizer::Impl>();
  impl->folder = folder;
  const fs::path tok_path = root / "tokenizer.json";
  const std::string file = tok_path.string();
  impl->tokenizer_file = file;
  if (!fs::is_regular_file(tok_path))
    throw CheckpointError(fmt::format("{}: missing; tprun reads the tokenizers library's tokenizer.json "
                                      "(vocab.json / merges.txt / tekken.json alone are not supported)",
                                      file));
  const json tj = read_bounded_json(tok_path, "tokenizer.json");
  if (!tj.is_object()) bad(file, "(top level)", "is not a JSON object");

  const fs::path cfg_path = root / "tokenizer_config.json", map_path = root / "special_tokens_map.json";
  const std::string cfg_file = cfg_path.string(), map_file = map_path.string();
  const json cfg = read_optional_json(cfg_file, "tokenizer config");
  const json special_map = read_optional_json(map_file, "special tokens map");

  // Which class transformers builds. PixtralProcessor (named by model_index.json, or by the folder's
  // processor files for AutoProcessor) loads its tokenizer as TokenizersBackend from tokenizer.json
  // whatever tokenizer_class says (transformers' processing_utils.py: the Mistral-Small-3.1 processor
  // files name LlamaTokenizerFast); AutoTokenizer would build that class instead.
  std::string cls = transformers_class;
  const bool pixtral = transformers_class == "PixtralProcessor" ||
                       (transformers_class == "AutoProcessor" && processor_class_of(root, cfg, cfg_file) == "PixtralProcessor");
  if (pixtral) {
    cls = "TokenizersBackend";
  } else if (cls.empty() || cls == "AutoTokenizer" || cls == "AutoProcessor") {
    cls.clear();
    if (auto it = cfg.find("tokenizer_class"); it != cfg.end() && !it->is_null()) {
      if (!it->is_string()) bad(cfg_file, "tokenizer_class", "is not a string");
      cls = it->get<std::string>();
    }
  }
  if (cls.size() > 4 && cls.compare(cls.size() - 4, 4, "Fast") == 0) cls.resize(cls.size() - 4);
  const bool qwen2 = cls == "Qwen2Tokenizer";
  if (!qwen2 && !cls.empty() && cls != "TokenizersBackend" && cls != "PreTrainedTokenizer")
    bad(transformers_class.empty() || transformers_class == "AutoProcessor" || transformers_class == "AutoTokenizer"
            ? cfg_file
            : folder,
        "tokenizer_class",
        fmt::format("'{}' is not a class tprun implements (TokenizersBackend, PreTrainedTokenizerFast, "
                    "Qwen2Tokenizer[Fast]): transformers 5 rebuilds that tokenizer in Python instead of reading "
                    "tokenizer.json",
                    cls));

  // Model, normalizer, pre-tokenizer, post-processor.
  if (!tj.contains("model")) bad(file, "model", "is missing");
  impl->model = BpeModel::from_json(tj["model"], file);
  parse_normalizer(tj.value("normalizer", json()), file, "normalizer", impl->normalizers);
  parse_pre_tokenizer(tj.value("pre_tokenizer", json()), file, "pre_tokenizer", impl->pre_tokenizers);
  parse_post_processor(tj.value("post_processor", json()), file, "post_processor", impl->post_processor);
  impl->byte_symbols = clip_byte_symbols();

  if (qwen2) {
    // transformers' Qwen2Tokenizer builds NFC + Split(regex, isolated) + ByteLevel(use_regex=false)
    // and BPE(byte_fallback=false, unk=None); tokenizer.json must say the same.
    const bool prefix = get_bool(cfg, "add_prefix_space", false, cfg_file, "(top level)");
    const auto& pre = impl->pre_tokenizers;
    const bool same_pre = pre.size() == 2 && pre[0].kind == HfPreTokenizerStep::Kind::kSplit &&
                          pre[0].regex->pattern() == kQwen2Pattern &&
                          pre[1].kind == HfPreTokenizerStep::Kind::kByteLevel && !pre[1].regex &&
                          pre[1].add_prefix_space == prefix;
    if (impl->normalizers != std::vector<HfNormalizerKind>{HfNormalizerKind::kNFC})
      bad(file, "normalizer", "is not {\"type\": \"NFC\"}, the normalizer transformers' Qwen2Tokenizer uses");
    if (!same_pre)
      bad(file, "pre_tokenizer",
          "is not the Sequence of Split(Qwen2's regex, Isolated) and ByteLevel(use_regex=false) that transformers' "
          "Qwen2Tokenizer uses");
    if (impl->model.byte_fallback() || impl->model.ignore_merges() || impl->model.has_unk())
      bad(file, "model", "has byte_fallback, ignore_merges or an unk_token; transformers' Qwen2Tokenizer builds its "
                         "BPE without them");
  }

  // Added tokens, as transformers 5 ends up with them.
  AddedTokenTable table(impl->model);
  std::vector<std::pair<HfAddedToken, std::string>> declared;  // token with its declared id, where
  std::vector<HfAddedToken> file_tokens;
  if (auto it = tj.find("added_tokens"); it != tj.end() && !it->is_null()) {
    if (!it->is_array()) bad(file, "added_tokens", "is not an array");
    if (static_cast<int64_t>(it->size()) > HfTokenizerLimits::kMaxAddedTokens) bad(file, "added_tokens", "has too many entries");
    for (size_t k = 0; k < it->size(); ++k) {
      const std::string where = fmt::format("added_tokens[{}]", k);
      HfAddedToken t = parse_added_entry((*it)[k], file, where, /*require_all=*/true);
      const auto& idv = (*it)[k].value("id", json());
      if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() > HfTokenizerLimits::kMaxId)
        bad(file, where + ".id", "is missing or not an id");
      t.id = idv.get<int64_t>();
      file_tokens.push_back(t);
      declared.emplace_back(t, fmt::format("{}: {}", file, where));
    }
  }
  std::vector<HfAddedToken> decoder_tokens;
  const bool has_decoder = cfg.contains("added_tokens_decoder");
  if (has_decoder) {
    const auto& dec = cfg["added_tokens_decoder"];
    if (!dec.is_object()) bad(cfg_file, "added_tokens_decoder", "is not an object");
    if (static_cast<int64_t>(dec.size()) > HfTokenizerLimits::kMaxAddedTokens) bad(cfg_file, "added_tokens_decoder", "has too many entries");
    for (const auto& [key, entry] : dec.items()) {
      const std::string where = fmt::format("added_tokens_decoder['{}']", key);
      HfAddedToken t = parse_added_entry(entry, cfg_file, where, /*require_all=*/false);
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || id < 0 || id > HfTokenizerLimits::kMaxId) bad(cfg_file, where, "key is not a token id");
      t.id = id;
      decoder_tokens.push_back(t);
      declared.emplace_back(t, fmt::format("{}: {}", cfg_file, where));
    }
    std::sort(decoder_tokens.begin(), decoder_tokens.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  }
  // Named special tokens: tokenizer_config.json (special_tokens_map.json only
  // when there is no added_tokens_decoder), then the class defaults.
  auto named = [&](const char* key, std::optional<std::string> fallback) -> std::optional<std::string> {
    if (!has_decoder && special_map.contains(key)) return token_string(special_map[key], map_file, key);
    if (cfg.contains(key)) return token_string(cfg[key], cfg_file, key);
    return fallback;
  };
  const std::optional<std::string> endoftext = qwen2 ? std::optional<std::string>("<|endoftext|>") : std::nullopt;
  std::vector<std::string> named_specials;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    const bool has_default = qwen2 && (std::string(key) == "eos_token" || std::string(key) == "unk_token" ||
                                       std::string(key) == "pad_token");
    auto v = named(key, has_default ? endoftext : std::nullopt);
    if (v) named_specials.push_back(*v);
    if (std::string(key) == "bos_token") impl->bos_token = v;
    if (std::string(key) == "pad_token") impl->pad_token = v;
  }
  if (!impl->pad_token) {  // tokenizer.json's padding section supplies a default pad token
    if (auto p = tj.find("padding"); p != tj.end() && p->is_object() && p->contains("pad_token") && (*p)["pad_token"].is_string())
      impl->pad_token = (*p)["pad_token"].get<std::string>();
  }
  std::vector<std::string> extras;
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    const json* src = nullptr;
    if (!has_decoder && special_map.contains(key)) src = &special_map[key];
    else if (cfg.contains(key)) src = &cfg[key];
    if (!src || src->is_null() || (src->is_object() && src->empty())) continue;
    if (!src->is_array())
      bad(cfg_file, key, "is not a list of tokens (model-specific named tokens are not implemented)");
    for (const auto& v : *src)
      if (auto s = token_string(v, cfg_file, key)) extras.push_back(*s);
  }
  auto default_special = [](const std::string& content) {
    HfAddedToken t;
    t.content = content;
    t.special = true;
    t.normalized = false;
    return t;
  };
  auto decoder_entry = [&](const std::string& content) -> const HfAddedToken* {
    for (const auto& t : decoder_tokens)
      if (t.content == content) return &t;
    return nullptr;
  };
  std::vector<HfAddedToken> first_batch;
  if (!qwen2) table.add_batch(file_tokens);  // Tokenizer.from_file
  if (qwen2 && !has_decoder) {  // transformers' legacy path: tokenizer.json's added tokens, by id
    decoder_tokens = file_tokens;
    std::sort(decoder_tokens.begin(), decoder_tokens.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  }
  first_batch = decoder_tokens;
  for (const auto& s : named_specials)
    if (!table.find(s) && !decoder_entry(s)) first_batch.push_back(default_special(s));
  for (const auto& s : extras)
    if (!table.find(s) && !decoder_entry(s)) first_batch.push_back(default_special(s));
  table.add_batch(first_batch);
  if (qwen2) {
    std::vector<HfAddedToken> again;
    for (const auto& s : named_specials) again.push_back(default_special(s));
    for (const auto& s : extras) again.push_back(default_special(s));
    table.add_batch(again);
  }
  {  // _post_init: named tokens as their added_tokens_decoder entries, extra ones as plain specials
    std::vector<HfAddedToken> post;
    for (const auto& s : named_specials) post.push_back(decoder_entry(s) ? *decoder_entry(s) : default_special(s));
    for (const auto& s : extras) post.push_back(default_special(s));
    table.add_batch(post);
  }
  for (const auto& [t, where] : declared) {
    const HfAddedToken* got = table.find(t.content);
    if (got && got->id != t.id)
      throw CheckpointError(fmt::format("{}: '{}' is declared with id {}, but transformers gives it id {}; refusing "
                                        "an ambiguous vocabulary",
                                        where, t.content, t.id, got->id));
  }
  impl->added = table.tokens();
  impl->split_special_tokens = get_bool(cfg, "split_special_tokens", false, cfg_file, "(top level)");

  if (impl->pad_token) {
    if (auto id = impl->added_id(*impl->pad_token)) impl->pad_id = *id;
    else if (int64_t v = impl->model.token_id(*impl->pad_token); v >= 0) impl->pad_id = v;
    else bad(cfg_file, "pad_token", fmt::format("'{}' is neither an added token nor in the vocabulary", *impl->pad_token));
  }

  // Sides: tokenizer_config.json, else tokenizer.json's padding / truncation, else right.
  auto side = [&](const char* cfg_key, const char* tj_key) {
    if (auto it = cfg.find(cfg_key); it != cfg.end() && !it->is_null()) {
      if (*it == "left") return true;
      if (*it == "right") return false;
      bad(cfg_file, cfg_key, fmt::format("is {}, not \"left\" or \"right\"", it->dump()));
    }
    if (auto it = tj.find(tj_key); it != tj.end() && it->is_object() && it->contains("direction")) {
      if ((*it)["direction"] == "Left") return true;
      if ((*it)["direction"] == "Right") return false;
      bad(file, std::string(tj_key) + ".direction", "is not \"Left\" or \"Right\"");
    }
    return false;
  };
  impl->pad_left = side("padding_side", "padding");
  impl->truncate_left = side("truncation_side", "truncation");

  // Chat templates.
  const fs::path jinja = root / "chat_template.jinja";
  std::optional<HfChatTemplateSource> jinja_template;
  if (fs::is_regular_file(jinja)) jinja_template = chat_source(jinja.string(), read_text(jinja));
  impl->tokenizer_chat_template = jinja_template ? jinja_template : chat_field(cfg, cfg_file);
  const fs::path proc_cfg = root / "processor_config.json", legacy = root / "chat_template.json";
  const json pcfg = read_optional_json(proc_cfg.string(), "processor config");
  if (auto t = chat_field(pcfg, proc_cfg.string())) {
    impl->processor_chat_template = t;
  } else if (fs::is_regular_file(legacy)) {
    const json lj = read_bounded_json(legacy, "chat template");
    if (!lj.is_object() || !lj.contains("chat_template") || !lj["chat_template"].is_string())
      bad(legacy.string(), "chat_template", "is missing or not a string");
    impl->processor_chat_template = chat_source(legacy.string(), lj["chat_template"].get<std::string>());
  } else {
    impl->processor_chat_template = jinja_template;
  }
  return impl;
}

}  // namespace tprun::text
