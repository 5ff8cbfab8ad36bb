// Reading a tokenizer folder into HfTokenizer::Impl: the class transformers
// builds, tokenizer.json's normalizer / pre_tokenizer / model /
// post_processor, the pad token and sides, the chat templates; the added
// tokens in hf_tokenizer_added_tokens.cpp. See hf_tokenizer.h for what is
// accepted; a folder without tokenizer.json is read from vocab.json +
// merges.txt as Qwen2Tokenizer builds it (hf_vocab_merges.h).

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "text/hf_tokenizer_impl.h"
#include "text/hf_vocab_merges.h"

namespace tprun::text {
namespace fs = std::filesystem;
using nlohmann::json;

void bad_field(const std::string& file, const std::string& field, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {} {}", file, field, what));
}

bool json_bool_field(const json& obj, const char* key, bool fallback, const std::string& file, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad_field(file, where + "." + key, fmt::format("is {}, not a boolean", it->dump()));
  return it->get<bool>();
}

namespace {

// Qwen2Tokenizer's pre-tokenizer regex (transformers models/qwen2/tokenization_qwen2.py).
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// ByteLevel's built-in regex (tokenizers pre_tokenizers/byte_level.rs).
const char* const kByteLevelPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

std::string get_type(const json& obj, const std::string& file, const std::string& where) {
  if (!obj.is_object()) bad_field(file, where, "is not an object");
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) bad_field(file, where + ".type", "is missing or not a string");
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
    if (it == n.end() || !it->is_array()) bad_field(file, where + ".normalizers", "is missing or not an array");
    if (it->size() > 64) bad_field(file, where + ".normalizers", "has more than 64 entries");
    for (size_t k = 0; k < it->size(); ++k)
      parse_normalizer((*it)[k], file, fmt::format("{}.normalizers[{}]", where, k), out);
  } else {
    bad_field(file, where + ".type", fmt::format("\"{}\" is not a normalizer tprun implements (NFC, NFD, NFKC, NFKD, Sequence)", type));
  }
}

SplitRegex compile_or_throw(const std::string& pattern, const std::string& file, const std::string& where) {
  try {
    return SplitRegex::compile(pattern);
  } catch (const std::invalid_argument& e) {
    bad_field(file, where, fmt::format("regex '{}' is outside what tprun implements: {}", pattern, e.what()));
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
    if (it == p.end() || !it->is_array()) bad_field(file, where + ".pretokenizers", "is missing or not an array");
    if (it->size() > 64) bad_field(file, where + ".pretokenizers", "has more than 64 entries");
    for (size_t k = 0; k < it->size(); ++k)
      parse_pre_tokenizer((*it)[k], file, fmt::format("{}.pretokenizers[{}]", where, k), out);
  } else if (type == "Split") {
    HfPreTokenizerStep step;
    step.kind = HfPreTokenizerStep::Kind::kSplit;
    auto pat = p.find("pattern");
    if (pat == p.end() || !pat->is_object() || pat->size() != 1)
      bad_field(file, where + ".pattern", "is not {\"Regex\": ...} or {\"String\": ...}");
    if (pat->contains("Regex") && (*pat)["Regex"].is_string())
      step.regex = compile_or_throw((*pat)["Regex"].get<std::string>(), file, where + ".pattern.Regex");
    else if (pat->contains("String") && (*pat)["String"].is_string() && !(*pat)["String"].get<std::string>().empty())
      step.regex = compile_or_throw(escape_literal((*pat)["String"].get<std::string>()), file, where + ".pattern.String");
    else
      bad_field(file, where + ".pattern", "is not {\"Regex\": string} or {\"String\": non-empty string}");
    auto behavior = p.find("behavior");
    if (behavior == p.end() || !behavior->is_string() || behavior->get<std::string>() != "Isolated")
      bad_field(file, where + ".behavior",
          fmt::format("is {}; tprun implements only \"Isolated\"", behavior == p.end() ? "missing" : behavior->dump()));
    if (json_bool_field(p, "invert", false, file, where))
      bad_field(file, where + ".invert", "is true; tprun implements only invert=false");
    out.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    HfPreTokenizerStep step;
    step.kind = HfPreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = json_bool_field(p, "add_prefix_space", true, file, where);
    if (json_bool_field(p, "use_regex", true, file, where)) step.regex = compile_or_throw(kByteLevelPattern, file, where);
    out.push_back(std::move(step));
  } else {
    bad_field(file, where + ".type", fmt::format("\"{}\" is not a pre-tokenizer tprun implements (Split, ByteLevel, Sequence)", type));
  }
}

void parse_post_processor(const json& p, const std::string& file, const std::string& where,
                          std::vector<HfTemplateStep>& out) {
  if (p.is_null()) return;
  const std::string type = get_type(p, file, where);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) bad_field(file, where + ".processors", "is missing or not an array");
    if (it->size() > 64) bad_field(file, where + ".processors", "has more than 64 entries");
    for (size_t k = 0; k < it->size(); ++k)
      parse_post_processor((*it)[k], file, fmt::format("{}.processors[{}]", where, k), out);
    return;
  }
  if (type != "TemplateProcessing")
    bad_field(file, where + ".type",
        fmt::format("\"{}\" is not a post-processor tprun implements (ByteLevel, TemplateProcessing, Sequence)", type));
  std::map<std::string, std::vector<int64_t>> specials;
  auto st = p.find("special_tokens");
  if (st != p.end() && !st->is_null()) {
    if (!st->is_object()) bad_field(file, where + ".special_tokens", "is not an object");
    for (const auto& [name, entry] : st->items()) {
      const std::string field = fmt::format("{}.special_tokens['{}'].ids", where, name);
      if (!entry.is_object() || !entry.contains("ids") || !entry["ids"].is_array() || entry["ids"].size() > 64)
        bad_field(file, field, "is missing or not an array of at most 64 ids");
      std::vector<int64_t> ids;
      for (const auto& id : entry["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > HfTokenizerLimits::kMaxId)
          bad_field(file, field, fmt::format("holds {}, not an id", id.dump()));
        ids.push_back(id.get<int64_t>());
      }
      specials[name] = std::move(ids);
    }
  }
  auto single = p.find("single");
  if (single == p.end() || !single->is_array() || single->size() > 64)
    bad_field(file, where + ".single", "is missing or not an array of at most 64 pieces");
  HfTemplateStep step;
  int sequences = 0;
  for (size_t k = 0; k < single->size(); ++k) {
    const auto& piece = (*single)[k];
    const std::string field = fmt::format("{}.single[{}]", where, k);
    if (piece.is_object() && piece.contains("Sequence") && piece["Sequence"].is_object()) {
      const auto& s = piece["Sequence"];
      if (!s.contains("id") || s["id"] != "A") bad_field(file, field, "is a sequence other than A (single sequences have only A)");
      step.items.push_back({true, {}});
      ++sequences;
    } else if (piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].is_object() &&
               piece["SpecialToken"].contains("id") && piece["SpecialToken"]["id"].is_string()) {
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      auto it = specials.find(name);
      if (it == specials.end()) bad_field(file, field, fmt::format("names the special token '{}', missing from special_tokens", name));
      step.items.push_back({false, it->second});
    } else {
      bad_field(file, field, fmt::format("is {}, not {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", piece.dump()));
    }
  }
  if (sequences != 1) bad_field(file, where + ".single", "does not hold the sequence $A exactly once");
  out.push_back(std::move(step));
}

// ---- chat templates ----------------------------------------------------------

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
    bad_field(file, "chat_template", "is a list of templates without one named \"default\"");
  }
  if (it->is_object() && it->contains("default") && (*it)["default"].is_string())
    return chat_source(file + " (chat_template 'default')", (*it)["default"].get<std::string>());
  bad_field(file, "chat_template", "is not a string or a list of named templates");
}

// The processor class AutoProcessor would build for the folder, as
// transformers' processing_auto.py looks for it: processor_config.json, then
// preprocessor_config.json, then tokenizer_config.json "processor_class";
// "" when none names one.
std::string processor_class_of(const fs::path& root, const json& tokenizer_config, const std::string& config_file) {
  auto named = [](const json& j, const std::string& file) -> std::optional<std::string> {
    auto it = j.find("processor_class");
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) bad_field(file, "processor_class", "is not a string");
    return it->get<std::string>();
  };
  for (const char* name : {"processor_config.json", "preprocessor_config.json"}) {
    const std::string file = (root / name).string();
    if (auto c = named(read_optional_json(file, name), file)) return *c;
  }
  return named(tokenizer_config, config_file).value_or("");
}

// ---- load_hf_tokenizer's steps ---------------------------------------------------

// tokenizer.json (bounded), tokenizer_config.json and special_tokens_map.json;
// without tokenizer.json, vocab.json + merges.txt (hf_vocab_merges.h).
HfFolderFiles read_folder_files(const fs::path& root) {
  HfFolderFiles files;
  const fs::path tok_path = root / "tokenizer.json";
  files.tokenizer_file = tok_path.string();
  if (!fs::is_regular_file(tok_path)) {
    if (has_vocab_merges_files(root)) return read_vocab_merges_folder(root);
    throw CheckpointError(fmt::format("{}: missing; tprun reads the tokenizers library's tokenizer.json, or "
                                      "vocab.json + merges.txt of a Qwen2Tokenizer (tekken.json alone is not supported)",
                                      files.tokenizer_file));
  }
  files.tokenizer_json = read_bounded_json(tok_path, "tokenizer.json");
  if (!files.tokenizer_json.is_object()) bad_field(files.tokenizer_file, "(top level)", "is not a JSON object");
  files.config_file = (root / "tokenizer_config.json").string();
  files.map_file = (root / "special_tokens_map.json").string();
  files.config = read_optional_json(files.config_file, "tokenizer config");
  files.special_map = read_optional_json(files.map_file, "special tokens map");
  return files;
}

// Which class transformers builds, without "Fast"; refuses classes that rebuild
// the tokenizer in Python. PixtralProcessor (named by model_index.json, or by
// the folder's processor files for AutoProcessor) loads its tokenizer as
// TokenizersBackend from tokenizer.json whatever tokenizer_class says
// (transformers' processing_utils.py: the Mistral-Small-3.1 processor files
// name LlamaTokenizerFast); AutoTokenizer would build that class instead.
std::string transformers_class_of(const fs::path& root, const std::string& folder, const std::string& requested,
                                  const HfFolderFiles& files) {
  std::string cls = requested;
  const bool pixtral = requested == "PixtralProcessor" ||
                       (requested == "AutoProcessor" && processor_class_of(root, files.config, files.config_file) == "PixtralProcessor");
  if (pixtral) {
    cls = "TokenizersBackend";
  } else if (cls.empty() || cls == "AutoTokenizer" || cls == "AutoProcessor") {
    cls.clear();
    if (auto it = files.config.find("tokenizer_class"); it != files.config.end() && !it->is_null()) {
      if (!it->is_string()) bad_field(files.config_file, "tokenizer_class", "is not a string");
      cls = it->get<std::string>();
    }
  }
  if (cls.size() > 4 && cls.compare(cls.size() - 4, 4, "Fast") == 0) cls.resize(cls.size() - 4);
  if (cls != "Qwen2Tokenizer" && !cls.empty() && cls != "TokenizersBackend" && cls != "PreTrainedTokenizer")
    bad_field(requested.empty() || requested == "AutoProcessor" || requested == "AutoTokenizer" ? files.config_file : folder,
              "tokenizer_class",
              fmt::format("'{}' is not a class tprun implements (TokenizersBackend, PreTrainedTokenizerFast, "
                          "Qwen2Tokenizer[Fast]): transformers 5 rebuilds that tokenizer in Python instead of reading "
                          "tokenizer.json",
                          cls));
  return cls;
}

// tokenizer.json's normalizer; for Qwen2Tokenizer always NFC, whatever the file
// says (null, another one): transformers' Qwen2Tokenizer.__init__ builds its
// backend from the file's vocab and merges and sets normalizers.NFC() itself.
void read_normalizer(const HfFolderFiles& files, bool qwen2, std::vector<HfNormalizerKind>& out) {
  const json n = files.tokenizer_json.value("normalizer", json());
  if (!qwen2) return parse_normalizer(n, files.tokenizer_file, "normalizer", out);
  out = {HfNormalizerKind::kNFC};
  if (!n.is_null() && n != json{{"type", "NFC"}}) {
    spdlog::warn("{}: normalizer {} is not used: a Qwen2Tokenizer applies NFC whatever tokenizer.json says (as "
                 "transformers does)",
                 files.tokenizer_file, clip_text(n.dump()));
  }
}

// transformers' Qwen2Tokenizer builds NFC + Split(regex, isolated) + ByteLevel(use_regex=false)
// and BPE(byte_fallback=false, unk=None); tokenizer.json must say the same.
void check_qwen2_pipeline(const HfTokenizer::Impl& impl, const HfFolderFiles& files) {
  const bool prefix = json_bool_field(files.config, "add_prefix_space", false, files.config_file, "(top level)");
  const auto& pre = impl.pre_tokenizers;
  const bool same_pre = pre.size() == 2 && pre[0].kind == HfPreTokenizerStep::Kind::kSplit &&
                        pre[0].regex->pattern() == kQwen2Pattern && pre[1].kind == HfPreTokenizerStep::Kind::kByteLevel &&
                        !pre[1].regex && pre[1].add_prefix_space == prefix;
  if (!same_pre)
    bad_field(files.tokenizer_file, "pre_tokenizer",
              "is not the Sequence of Split(Qwen2's regex, Isolated) and ByteLevel(use_regex=false) that transformers' "
              "Qwen2Tokenizer uses");
  if (impl.model.byte_fallback() || impl.model.ignore_merges() || impl.model.has_unk())
    bad_field(files.tokenizer_file, "model", "has byte_fallback, ignore_merges or an unk_token; transformers' Qwen2Tokenizer builds its "
                               "BPE without them");
}

// The pad id and the padding / truncation sides: tokenizer_config.json, else
// tokenizer.json's padding / truncation, else right.
void read_padding(HfTokenizer::Impl& impl, const HfFolderFiles& files) {
  if (impl.pad_token) {
    if (auto id = impl.added_id(*impl.pad_token)) impl.pad_id = *id;
    else if (int64_t v = impl.model.token_id(*impl.pad_token); v >= 0) impl.pad_id = v;
    else bad_field(files.config_file, "pad_token", fmt::format("'{}' is neither an added token nor in the vocabulary", *impl.pad_token));
  }
  auto side = [&](const char* cfg_key, const char* tj_key) {
    if (auto it = files.config.find(cfg_key); it != files.config.end() && !it->is_null()) {
      if (*it == "left") return true;
      if (*it == "right") return false;
      bad_field(files.config_file, cfg_key, fmt::format("is {}, not \"left\" or \"right\"", it->dump()));
    }
    if (auto it = files.tokenizer_json.find(tj_key); it != files.tokenizer_json.end() && it->is_object() && it->contains("direction")) {
      if ((*it)["direction"] == "Left") return true;
      if ((*it)["direction"] == "Right") return false;
      bad_field(files.tokenizer_file, std::string(tj_key) + ".direction", "is not \"Left\" or \"Right\"");
    }
    return false;
  };
  impl.pad_left = side("padding_side", "padding");
  impl.truncate_left = side("truncation_side", "truncation");
}

// The tokenizer's template (chat_template.jinja, else tokenizer_config.json)
// and the processor's (processor_config.json, else chat_template.json, else
// chat_template.jinja).
void read_chat_templates(HfTokenizer::Impl& impl, const fs::path& root, const HfFolderFiles& files) {
  const fs::path jinja = root / "chat_template.jinja";
  std::optional<HfChatTemplateSource> jinja_template;
  if (fs::is_regular_file(jinja)) jinja_template = chat_source(jinja.string(), read_text(jinja));
  impl.tokenizer_chat_template = jinja_template ? jinja_template : chat_field(files.config, files.config_file);
  const fs::path proc_cfg = root / "processor_config.json", legacy = root / "chat_template.json";
  const json processor_config = read_optional_json(proc_cfg.string(), "processor config");
  if (auto t = chat_field(processor_config, proc_cfg.string())) {
    impl.processor_chat_template = t;
  } else if (fs::is_regular_file(legacy)) {
    const json legacy_json = read_bounded_json(legacy, "chat template");
    if (!legacy_json.is_object() || !legacy_json.contains("chat_template") || !legacy_json["chat_template"].is_string())
      bad_field(legacy.string(), "chat_template", "is missing or not a string");
    impl.processor_chat_template = chat_source(legacy.string(), legacy_json["chat_template"].get<std::string>());
  } else {
    impl.processor_chat_template = jinja_template;
  }
}

}  // namespace

std::shared_ptr<HfTokenizer::Impl> load_hf_tokenizer(const std::string& folder, const std::string& transformers_class) {
  const fs::path root(folder);
  if (!fs::is_directory(root)) throw CheckpointError(fmt::format("{}: tokenizer folder not found", folder));
  const HfFolderFiles files = read_folder_files(root);
  const std::string cls = transformers_class_of(root, folder, transformers_class, files);
  if (files.tokenizer_file != (root / "tokenizer.json").string()) check_vocab_merges_class(files, cls);
  const bool qwen2 = cls == "Qwen2Tokenizer";
  auto impl = std::make_shared<HfTokenizer::Impl>();
  impl->folder = folder;
  impl->tokenizer_file = files.tokenizer_file;
  if (!files.tokenizer_json.contains("model")) bad_field(files.tokenizer_file, "model", "is missing");
  impl->model = BpeModel::from_json(files.tokenizer_json["model"], files.tokenizer_file);
  read_normalizer(files, qwen2, impl->normalizers);
  parse_pre_tokenizer(files.tokenizer_json.value("pre_tokenizer", json()), files.tokenizer_file, "pre_tokenizer", impl->pre_tokenizers);
  parse_post_processor(files.tokenizer_json.value("post_processor", json()), files.tokenizer_file, "post_processor", impl->post_processor);
  if (qwen2) check_qwen2_pipeline(*impl, files);
  load_added_tokens(*impl, files, qwen2);
  impl->split_special_tokens = json_bool_field(files.config, "split_special_tokens", false, files.config_file, "(top level)");
  read_padding(*impl, files);
  read_chat_templates(*impl, root, files);
  return impl;
}

}  // namespace tprun::text
