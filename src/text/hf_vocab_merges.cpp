// Reading the vocab.json + merges.txt layout into the tokenizer.json that
// transformers' Qwen2Tokenizer builds from it (see hf_vocab_merges.h).

#include "text/hf_vocab_merges.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::text {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Qwen2Tokenizer's split regex; hf_tokenizer_load.cpp checks a Qwen2
// pipeline against the same text.
const char* const kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A token as messages show it: at most 64 bytes.
std::string shown(std::string_view s) {
  if (s.size() <= 64) return std::string(s);
  return std::string(s.substr(0, 64)) + "...";
}

// The whole file, after checking it is a regular file of at most kMaxFileBytes.
std::string read_bounded_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw CheckpointError(fmt::format("{}: the {} is not a regular file", path.string(), what));
  const auto size = fs::file_size(path, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot be read ({})", path.string(), ec.message()));
  if (static_cast<int64_t>(size) > HfTokenizerLimits::kMaxFileBytes)
    throw CheckpointError(fmt::format("{}: {} bytes, above the limit of {} for a {}", path.string(), size,
                                      HfTokenizerLimits::kMaxFileBytes, what));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("{}: cannot open the {}", path.string(), what));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (static_cast<int64_t>(ss.str().size()) > HfTokenizerLimits::kMaxFileBytes)  // grew while read
    throw CheckpointError(fmt::format("{}: larger than the limit of {} for a {}", path.string(),
                                      HfTokenizerLimits::kMaxFileBytes, what));
  return std::move(ss).str();
}

// A JSON object file; `optional` ones are {} when absent.
json read_object_file(const fs::path& path, const std::string& what, bool optional) {
  std::error_code ec;
  if (optional && !fs::exists(path, ec)) return json::object();
  json j = parse_strict_json(read_bounded_file(path, what), path.string(), what);
  if (!j.is_object()) throw CheckpointError(fmt::format("{}: the {} is not a JSON object", path.string(), what));
  return j;
}

// vocab.json: token -> id, ids exactly 0..N-1 (a permutation: no duplicate,
// no gap, so added tokens cannot land on a vocabulary id).
json read_vocab(const fs::path& path) {
  json vocab = read_object_file(path, "vocabulary", false);
  const std::string file = path.string();
  const auto n = static_cast<int64_t>(vocab.size());
  if (n > HfTokenizerLimits::kMaxVocab)
    bad_field(file, "(top level)", fmt::format("has {} entries, above the limit {}", n, HfTokenizerLimits::kMaxVocab));
  std::vector<const std::string*> by_id(static_cast<size_t>(n), nullptr);
  for (const auto& [token, id] : vocab.items()) {
    const std::string where = fmt::format("entry '{}'", shown(token));
    if (static_cast<int64_t>(token.size()) > HfTokenizerLimits::kMaxTokenBytes)
      bad_field(file, where, fmt::format("is a token of {} bytes, above the limit {}", token.size(), HfTokenizerLimits::kMaxTokenBytes));
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= n)
      bad_field(file, where, fmt::format("has id {}; the ids of {} entries must be 0..{}, each once", shown(id.dump()), n, n - 1));
    const auto k = static_cast<size_t>(id.get<int64_t>());
    if (by_id[k] != nullptr)
      bad_field(file, where, fmt::format("has id {}, which '{}' has too; each id must name one token", k, shown(*by_id[k])));
    by_id[k] = &token;
  }
  return vocab;
}

// merges.txt as [[a, b], ...] in rank order.
json read_merges(const fs::path& path, const json& vocab) {
  const std::string text = read_bounded_file(path, "merges list");
  const std::string file = path.string();
  json merges = json::array();
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    std::string_view line(text.data() + pos, (end == std::string::npos ? text.size() : end) - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    ++line_no;
    if (end != std::string::npos && !line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 8) == "#version") continue;
    const std::string where = fmt::format("line {}", line_no);
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
      bad_field(file, where, fmt::format("'{}' is not two symbols separated by one space", shown(line)));
    const std::string a(line.substr(0, sp)), b(line.substr(sp + 1));
    const std::string symbols[3] = {a, b, a + b};
    for (int k = 0; k < 3; ++k)
      if (!vocab.contains(symbols[k]))
        bad_field(file, where,
                  fmt::format("merges '{}' and '{}', but {}'{}' is not in vocab.json", shown(a), shown(b),
                              k < 2 ? "" : "the merged token ", shown(symbols[k])));
    if (static_cast<int64_t>(merges.size()) >= HfTokenizerLimits::kMaxMerges)
      bad_field(file, where, fmt::format("is past the limit of {} merges", HfTokenizerLimits::kMaxMerges));
    merges.push_back(json::array({a, b}));
  }
  return merges;
}

// A special-token value: "tok", null, or {"content": "tok", ...}.
std::optional<std::string> token_text(const json& v, const std::string& file, const std::string& key) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  bad_field(file, key, "is neither a string, null nor {\"content\": string}");
}

// The tokens transformers counts as special when it reads added_tokens.json:
// the named ones (special_tokens_map.json over tokenizer_config.json) and the
// extra ones of tokenizer_config.json (additional_special_tokens,
// extra_special_tokens) and of special_tokens_map.json (extra_special_tokens).
std::set<std::string> legacy_special_tokens(const HfFolderFiles& files) {
  std::set<std::string> out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    std::optional<std::string> v;
    if (files.special_map.contains(key)) v = token_text(files.special_map[key], files.map_file, key);
    else if (files.config.contains(key)) v = token_text(files.config[key], files.config_file, key);
    if (v && !v->empty()) out.insert(*v);
  }
  auto extras = [&](const json& obj, const std::string& file, const char* key) {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_array()) return;
    for (const auto& v : *it)
      if (auto s = token_text(v, file, key)) out.insert(*s);
  };
  extras(files.config, files.config_file, "additional_special_tokens");
  extras(files.config, files.config_file, "extra_special_tokens");
  extras(files.special_map, files.map_file, "extra_special_tokens");
  return out;
}

// added_tokens.json (legacy, read only without added_tokens_decoder) as
// tokenizer.json "added_tokens" entries. transformers adds them in id order:
// a vocabulary token keeps its id, the others take the ids after the
// vocabulary one by one; an id that differs from that is refused here.
json legacy_added_tokens(const fs::path& root, const HfFolderFiles& files, const json& vocab) {
  const fs::path path = root / "added_tokens.json";
  const json added = read_object_file(path, "added tokens list", true);
  const std::string file = path.string();
  if (static_cast<int64_t>(added.size()) > HfTokenizerLimits::kMaxAddedTokens)
    bad_field(file, "(top level)", fmt::format("has {} entries, above the limit {}", added.size(), HfTokenizerLimits::kMaxAddedTokens));
  std::vector<std::pair<int64_t, std::string>> by_id;
  for (const auto& [content, id] : added.items()) {
    const std::string where = fmt::format("entry '{}'", shown(content));
    if (content.empty() || static_cast<int64_t>(content.size()) > HfTokenizerLimits::kMaxTokenBytes)
      bad_field(file, where, "is an empty token or longer than the token limit");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > HfTokenizerLimits::kMaxId)
      bad_field(file, where, fmt::format("has id {}, not an id in [0, 2^31)", shown(id.dump())));
    by_id.emplace_back(id.get<int64_t>(), content);
  }
  std::sort(by_id.begin(), by_id.end());
  const std::set<std::string> special = legacy_special_tokens(files);
  int64_t next = static_cast<int64_t>(vocab.size());
  json out = json::array();
  for (size_t k = 0; k < by_id.size(); ++k) {
    const auto& [id, content] = by_id[k];
    const std::string where = fmt::format("entry '{}'", shown(content));
    if (k > 0 && by_id[k - 1].first == id)
      bad_field(file, where, fmt::format("has id {}, which '{}' has too", id, shown(by_id[k - 1].second)));
    auto in_vocab = vocab.find(content);
    const int64_t expected = in_vocab != vocab.end() ? in_vocab->get<int64_t>() : next++;
    if (id != expected)
      bad_field(file, where,
                fmt::format("has id {}, but transformers gives it id {} (a vocabulary token keeps its id, the others "
                            "follow the {} vocabulary ids in id order); refusing an ambiguous vocabulary",
                            id, expected, vocab.size()));
    const bool is_special = special.count(content) > 0;
    out.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                   {"normalized", !is_special}, {"special", is_special}});
  }
  return out;
}

}  // namespace

bool has_vocab_merges_files(const fs::path& root) {
  std::error_code ec;
  return fs::is_regular_file(root / "vocab.json", ec) && fs::is_regular_file(root / "merges.txt", ec);
}

HfFolderFiles read_vocab_merges_folder(const fs::path& root) {
  HfFolderFiles files;
  files.tokenizer_file = (root / "vocab.json").string();
  files.config_file = (root / "tokenizer_config.json").string();
  files.map_file = (root / "special_tokens_map.json").string();
  files.config = read_object_file(files.config_file, "tokenizer config", true);
  const bool has_decoder = files.config.contains("added_tokens_decoder");
  // With added_tokens_decoder transformers does not open special_tokens_map.json.
  files.special_map = has_decoder ? json::object() : read_object_file(files.map_file, "special tokens map", true);
  for (const char* key : {"add_bos_token", "add_eos_token"})
    if (json_bool_field(files.config, key, false, files.config_file, "(top level)"))
      bad_field(files.config_file, key,
                "is true; tprun builds the vocab.json + merges.txt layout only without added bos / eos tokens "
                "(a tokenizer.json with its post_processor is read as it is)");
  const bool prefix = json_bool_field(files.config, "add_prefix_space", false, files.config_file, "(top level)");

  json vocab = read_vocab(root / "vocab.json");
  json merges = read_merges(root / "merges.txt", vocab);
  json added = has_decoder ? json::array() : legacy_added_tokens(root, files, vocab);
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", kQwen2SplitRegex}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"trim_offsets", true}, {"use_regex", false}};
  files.tokenizer_json = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", std::move(added)},
                          {"normalizer", {{"type", "NFC"}}},
                          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level})}}},
                          {"post_processor", nullptr},
                          {"decoder", {{"type", "ByteLevel"}}},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", ""},
                            {"end_of_word_suffix", ""},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"ignore_merges", false},
                            {"vocab", std::move(vocab)},
                            {"merges", std::move(merges)}}}};
  return files;
}

void check_vocab_merges_class(const HfFolderFiles& files, const std::string& cls) {
  if (cls == "Qwen2Tokenizer") return;
  bad_field(files.config_file, "tokenizer_class",
            fmt::format("is {}; without tokenizer.json tprun builds only Qwen2Tokenizer[Fast] from vocab.json + "
                        "merges.txt (transformers builds other classes from these files differently)",
                        cls.empty() ? "missing" : "'" + cls + "'"));
}

}  // namespace tprun::text
