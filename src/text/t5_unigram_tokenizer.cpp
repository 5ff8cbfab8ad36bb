// transformers 5's T5Tokenizer from tokenizer.json (see t5_unigram_tokenizer.h).
#include "text/t5_unigram_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "text/hf_bpe.h"

namespace tprun::text {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kUnkId = 2;  // T5Tokenizer: Unigram(vocab, unk_id=2)
const char* const kMeta = "\xE2\x96\x81";  // "▁"

// Standard base64 (RFC 4648; padding optional). CheckpointError naming `what`.
std::string base64_decode(const std::string& text, const std::string& what) {
  auto value = [&](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    throw CheckpointError(fmt::format("{}: not base64 (character 0x{:02x})", what, static_cast<unsigned char>(c)));
  };
  std::string s = text;
  while (!s.empty() && s.back() == '=') s.pop_back();
  if (s.size() % 4 == 1) throw CheckpointError(fmt::format("{}: not base64 (length {})", what, text.size()));
  std::string out;
  out.reserve(s.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    acc = (acc << 6) | static_cast<uint32_t>(value(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

// tokenizer.json's model: a Unigram vocabulary of [piece, score] pairs.
std::vector<std::pair<std::string, double>> read_vocab(const json& tok, const std::string& file) {
  if (!tok.contains("model") || !tok["model"].is_object())
    throw CheckpointError(fmt::format("{}: field 'model' is missing or not an object", file));
  const json& model = tok["model"];
  const std::string type = model.value("type", "");
  if (type != "Unigram")
    throw CheckpointError(fmt::format("{}: model.type '{}' is not 'Unigram' (a T5 tokenizer's model)", file, type));
  if (!model.contains("vocab") || !model["vocab"].is_array())
    throw CheckpointError(fmt::format("{}: model.vocab is missing or not a list", file));
  const json& v = model["vocab"];
  if (static_cast<int64_t>(v.size()) > HfTokenizerLimits::kMaxVocab)
    throw CheckpointError(fmt::format("{}: model.vocab has {} pieces, above the limit of {}", file, v.size(),
                                      HfTokenizerLimits::kMaxVocab));
  std::vector<std::pair<std::string, double>> vocab;
  vocab.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      throw CheckpointError(fmt::format("{}: model.vocab[{}] is not a [piece, score] pair", file, i));
    std::string piece = e[0].get<std::string>();
    if (static_cast<int64_t>(piece.size()) > HfTokenizerLimits::kMaxTokenBytes)
      throw CheckpointError(fmt::format("{}: model.vocab[{}] is {} bytes, above the limit of {}", file, i, piece.size(),
                                        HfTokenizerLimits::kMaxTokenBytes));
    try {
      decode_utf8(piece, "piece");
    } catch (const Error&) {
      throw CheckpointError(fmt::format("{}: model.vocab[{}] is not valid UTF-8", file, i));
    }
    vocab.emplace_back(std::move(piece), e[1].get<double>());
  }
  if (static_cast<int64_t>(vocab.size()) <= kUnkId)
    throw CheckpointError(fmt::format("{}: model.vocab has {} pieces; T5Tokenizer's unk_id is 2", file, vocab.size()));
  return vocab;
}

// The Precompiled normalizer's charsmap (top level or inside a Sequence), as
// transformers extracts it; empty when there is none.
std::string read_charsmap(const json& tok, const std::string& file) {
  if (!tok.contains("normalizer") || tok["normalizer"].is_null()) return {};
  json list = tok["normalizer"];
  if (list.is_object() && list.value("type", "") == "Sequence") list = list.value("normalizers", json::array());
  if (!list.is_array()) list = json::array({list});
  for (const auto& n : list) {
    if (!n.is_object() || n.value("type", "") != "Precompiled" || !n.contains("precompiled_charsmap")) continue;
    if (!n["precompiled_charsmap"].is_string())
      throw CheckpointError(fmt::format("{}: normalizer.precompiled_charsmap is not a string", file));
    return base64_decode(n["precompiled_charsmap"].get<std::string>(), file + ": normalizer.precompiled_charsmap");
  }
  return {};
}

// One piece per word: "▁" before it unless it starts with one, then cut before every "▁".
void metaspace_pieces(const std::string& word, std::vector<std::string>& out) {
  std::string w = word.rfind(kMeta, 0) == 0 ? word : kMeta + word;
  size_t start = 0;
  for (size_t pos = w.find(kMeta, 3); pos != std::string::npos; pos = w.find(kMeta, pos + 3)) {
    out.push_back(w.substr(start, pos - start));
    start = pos;
  }
  out.push_back(w.substr(start));
}

// added_tokens_decoder, checked as transformers assigns ids: a vocabulary
// piece keeps its id; a new token gets the next id past the vocabulary, in
// the order of the declared ids.
std::vector<AddedToken> checked_added_tokens(const json& config, const std::string& config_file,
                                             const UnigramModel& model) {
  std::vector<AddedToken> declared = parse_added_tokens(config, config_file);
  std::sort(declared.begin(), declared.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  int64_t next = model.size();
  for (const auto& t : declared) {
    const int64_t in_vocab = model.id_of(t.content);
    const int64_t expected = in_vocab >= 0 ? in_vocab : next++;
    if (t.id != expected) {
      throw CheckpointError(fmt::format("{}: added_tokens_decoder gives '{}' id {}, but transformers would give it {} "
                                        "({})",
                                        config_file, t.content, t.id, expected,
                                        in_vocab >= 0 ? "its id in tokenizer.json's vocabulary"
                                                      : "the next id past the vocabulary"));
    }
  }
  return declared;
}

// The special token `key` names, as transformers 5 reads it: tokenizer_config.json's value first,
// special_tokens_map.json's only where the config has none ("" for neither). A pad_token or
// eos_token set to null in the config leaves the tokenizer without it: WanPipeline pads every prompt
// to max_length and ends it with eos, so every request would fail (CheckpointError).
std::string special_token_content(const json& config, const std::string& config_file, const json& special_map,
                                  const std::string& map_file, const char* key) {
  const bool in_config = config.is_object() && config.contains(key);
  if (in_config && config[key].is_null() && std::string(key) != "unk_token") {
    throw CheckpointError(fmt::format("{}: {} is null or missing; a T5 tokenizer pads every prompt to "
                                      "max_length and ends it with eos, so every request would fail: set {} "
                                      "to a token of the vocabulary (UMT5's are \"<pad>\" and \"</s>\")",
                                      config_file, key, key),
                          true);
  }
  if (in_config && !config[key].is_null()) return special_token_string(json::object(), map_file, config, config_file, key);
  return special_token_string(special_map, map_file, config, config_file, key);
}

// additional_special_tokens (T5Tokenizer: <extra_id_0..extra_ids-1> when the config has none).
std::vector<std::string> additional_special_tokens(const json& config, const json& special_map,
                                                   const std::string& config_file) {
  int64_t extra_ids = 100;
  if (config.contains("extra_ids")) {
    if (!config["extra_ids"].is_number_integer() || config["extra_ids"].get<int64_t>() < 0 ||
        config["extra_ids"].get<int64_t>() > HfTokenizerLimits::kMaxAddedTokens)
      throw CheckpointError(fmt::format("{}: extra_ids {} is not an integer in [0, {}]", config_file,
                                        config["extra_ids"].dump(), HfTokenizerLimits::kMaxAddedTokens));
    extra_ids = config["extra_ids"].get<int64_t>();
  }
  std::vector<std::string> additional;
  const json* list = config.contains("additional_special_tokens") ? &config["additional_special_tokens"]
                     : special_map.contains("additional_special_tokens") ? &special_map["additional_special_tokens"]
                                                                         : nullptr;
  int64_t sentinels = 0;
  if (list && !list->is_null()) {
    if (!list->is_array() || static_cast<int64_t>(list->size()) > HfTokenizerLimits::kMaxAddedTokens)
      throw CheckpointError(fmt::format("{}: additional_special_tokens is not a list (of at most {})", config_file,
                                        HfTokenizerLimits::kMaxAddedTokens));
    for (const auto& e : *list) {
      const json& c = e.is_object() && e.contains("content") ? e["content"] : e;
      if (!c.is_string())
        throw CheckpointError(fmt::format("{}: additional_special_tokens holds {}, not a token", config_file, e.dump()));
      additional.push_back(c.get<std::string>());
      if (additional.back().find("<extra_id_") != std::string::npos) ++sentinels;
    }
    if (sentinels > 0 && extra_ids > 0 && sentinels != extra_ids)
      throw CheckpointError(fmt::format("{}: extra_ids is {} but additional_special_tokens holds {} <extra_id_N> "
                                        "tokens (transformers refuses this folder)",
                                        config_file, extra_ids, sentinels));
  }
  if (sentinels == 0)
    for (int64_t i = 0; i < extra_ids; ++i) additional.push_back(fmt::format("<extra_id_{}>", i));
  return additional;
}

}  // namespace

T5UnigramTokenizer::T5UnigramTokenizer(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw CheckpointError(fmt::format("{}: T5 tokenizer folder not found", dir));
  const fs::path tok_path = root / "tokenizer.json";
  if (!fs::is_regular_file(tok_path)) {
    throw CheckpointError(fmt::format(
        "{}: missing; tprun reads this tokenizer from tokenizer.json as transformers 5 does first{}", tok_path.string(),
        fs::exists(root / "spiece.model") ? " (a folder with spiece.model alone is not supported)" : ""));
  }
  const std::string tok_file = tok_path.string();
  const json tok = read_bounded_json(tok_path, "tokenizer.json");
  if (!tok.is_object()) throw CheckpointError(fmt::format("{}: not a JSON object", tok_file));
  model_ = UnigramModel(read_vocab(tok, tok_file), kUnkId, tok_file);
  const std::string charsmap = read_charsmap(tok, tok_file);
  if (!charsmap.empty()) normalizer_ = SpmPrecompiled(charsmap, tok_file + ": normalizer");

  const fs::path config_path = root / "tokenizer_config.json", map_path = root / "special_tokens_map.json";
  const std::string config_file = config_path.string(), map_file = map_path.string();
  const json config = read_optional_json(config_file, "tokenizer config");
  const json special_map = read_optional_json(map_file, "special tokens map");

  for (const auto& t : checked_added_tokens(config, config_file, model_)) added_.push_back(t);
  auto ensure_added = [&](const std::string& content, const std::string& key) {
    for (const auto& t : added_)
      if (t.content == content) return t.id;
    const int64_t id = model_.id_of(content);
    if (id < 0)
      throw CheckpointError(fmt::format("{}: {} names '{}', which is neither a piece of {} nor in "
                                        "added_tokens_decoder (transformers would add it as a new token past the "
                                        "vocabulary; tprun refuses a special token the tokenizer does not have)",
                                        config_file, key, content, tok_file),
                            true);
    added_.push_back(AddedToken{content, id, false, false});
    return id;
  };
  auto special = [&](const char* key, const char* fallback) {
    const std::string s = special_token_content(config, config_file, special_map, map_file, key);
    return ensure_added(s.empty() ? fallback : s, key);
  };
  eos_id_ = special("eos_token", "</s>");
  (void)special("unk_token", "<unk>");
  pad_id_ = special("pad_token", "<pad>");
  unk_id_ = kUnkId;
  for (const auto& a : additional_special_tokens(config, special_map, config_file)) {
    ensure_added(a, "additional_special_tokens");
  }

  vocab_size_ = model_.size();
  for (const auto& t : added_) vocab_size_ = std::max(vocab_size_, t.id + 1);
  added_trie_ = added_token_trie(added_);
}

void T5UnigramTokenizer::encode_text(const std::string& text, std::vector<int64_t>& ids) const {
  const std::string normalized = normalizer_.empty() ? text : normalizer_.normalize(text);
  // WhitespaceSplit: words between runs of White_Space code points.
  const std::u32string cps = decode_utf8(normalized, "prompt");
  std::vector<std::string> pieces;
  std::string word;
  for (char32_t c : cps) {
    if (u_isUWhiteSpace(static_cast<UChar32>(c))) {
      if (!word.empty()) metaspace_pieces(word, pieces);
      word.clear();
    } else {
      append_utf8(word, c);
    }
  }
  if (!word.empty()) metaspace_pieces(word, pieces);
  for (const auto& p : pieces) model_.encode(p, ids);
}

std::vector<int64_t> T5UnigramTokenizer::content_ids(const std::string& prompt) const {
  return content_ids_with(prompt, added_, added_trie_,
                          [this](const std::string& text, std::vector<int64_t>& ids) { encode_text(text, ids); });
}

TokenizerOutput T5UnigramTokenizer::encode(const std::string& prompt, int64_t max_length) const {
  if (max_length < 1)
    throw RequestError(fmt::format("T5 tokenizer {}: max_length {} leaves no room for eos", dir_, max_length));
  const int64_t eos = eos_id_;
  return finish_encoding(content_ids(prompt), max_length, 1, pad_id_, [eos](std::vector<int64_t> ids) {
    ids.push_back(eos);  // TemplateProcessing "$A </s>"
    return ids;
  });
}

}  // namespace tprun::text
