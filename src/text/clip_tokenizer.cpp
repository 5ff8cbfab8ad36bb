#include "text/clip_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "text/byte_level.h"
#include "text/clip_text_clean.h"

namespace tprun::text {
namespace fs = std::filesystem;

namespace {

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("{}: cannot be read", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

ClipTokenizer::ClipTokenizer(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw CheckpointError(fmt::format("{}: CLIP tokenizer folder not found", dir));
  const fs::path vocab_path = root / "vocab.json", merges_path = root / "merges.txt";
  for (const auto& p : {vocab_path, merges_path})
    if (!fs::is_regular_file(p)) throw CheckpointError(fmt::format("{}: missing (CLIP tokenizer file)", p.string()));
  read_vocab(vocab_path.string());
  for (const auto& symbol : byte_level_symbols()) {
    intern_symbol(symbol);
    intern_symbol(symbol + "</w>");
  }
  read_merges(merges_path.string());
  read_special_tokens((root / "tokenizer_config.json").string(), (root / "special_tokens_map.json").string(),
                      vocab_path.string());
  map_symbols_to_tokens(vocab_path.string());
  added_trie_ = added_token_trie(added_);
}

void ClipTokenizer::read_vocab(const std::string& path) {
  const nlohmann::json vocab = read_json_file(path, "CLIP vocabulary");
  if (!vocab.is_object() || vocab.empty())
    throw CheckpointError(fmt::format("{}: not a non-empty JSON object of token -> id", path));
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw CheckpointError(fmt::format("{}: token '{}' has id {}, not a non-negative integer", path, token, id.dump()));
    vocab_[token] = id.get<int64_t>();
  }
}

uint32_t ClipTokenizer::intern_symbol(const std::string& symbol) {
  auto [it, added] = symbol_ids_.emplace(symbol, static_cast<uint32_t>(symbol_text_.size()));
  if (added) symbol_text_.push_back(symbol);
  return it->second;
}

void ClipTokenizer::read_merges(const std::string& path) {
  // transformers: read().strip().split("\n")[1:49152 - 256 - 2 + 1]; the first line is "#version: ...".
  std::string text = read_text_file(path);
  const char* ws = " \t\n\r\f\v";
  const size_t b = text.find_first_not_of(ws), e = text.find_last_not_of(ws);
  text = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
  std::istringstream lines(text);
  std::string line;
  int64_t line_no = 0;
  uint32_t rank = 0;
  constexpr int64_t kMaxLines = 49152 - 256 - 2 + 1;
  while (std::getline(lines, line) && ++line_no <= kMaxLines) {
    if (line_no == 1) continue;
    std::istringstream fields(line);
    std::string first, second, extra;
    if (!(fields >> first >> second) || (fields >> extra))
      throw CheckpointError(fmt::format("{}: line {} is not a merge of two symbols: '{}'", path, line_no, line));
    const uint32_t left = intern_symbol(first), right = intern_symbol(second);
    merges_.add(left, right, intern_symbol(first + second), rank++);
  }
  if (rank == 0) throw CheckpointError(fmt::format("{}: holds no merges", path));
}

void ClipTokenizer::read_special_tokens(const std::string& config_path, const std::string& map_path,
                                        const std::string& vocab_path) {
  const nlohmann::json config = read_optional_json(config_path, "tokenizer config");
  const nlohmann::json special_map = read_optional_json(map_path, "special tokens map");
  added_ = parse_added_tokens(config, config_path);
  auto special = [&](const char* key, const char* fallback) {
    std::string s = special_token_string(special_map, map_path, config, config_path, key);
    if (s.empty()) s = fallback;
    bool added = false;
    for (const auto& t : added_) added = added || t.content == s;
    if (!added && !vocab_.count(s))
      throw CheckpointError(fmt::format("{}: {} '{}' is neither in {} nor an added token", config_path, key, s, vocab_path));
    if (!added) added_.push_back(AddedToken{s, vocab_.at(s), false, false});
    return s;
  };
  const std::string unk = special("unk_token", "<|endoftext|>");
  const std::string bos = special("bos_token", "<|startoftext|>");
  const std::string eos = special("eos_token", "<|endoftext|>");
  const std::string pad = special("pad_token", "<|endoftext|>");
  unk_id_ = vocab_.count(unk) ? vocab_.at(unk) : 0;
  for (const auto& t : added_)
    if (t.content == unk) unk_id_ = t.id;
  bos_id_ = token_id(bos);
  eos_id_ = token_id(eos);
  pad_id_ = token_id(pad);
  if (config.contains("model_max_length")) {
    const auto& m = config["model_max_length"];
    if (!m.is_number_integer() || m.get<int64_t>() < 2)
      throw CheckpointError(fmt::format("{}: model_max_length {} is not an integer >= 2", config_path, m.dump()));
    model_max_length_ = m.get<int64_t>();
  }
  // transformers seeds the BPE cache with the bos and eos strings.
  cache_[bos] = {bos_id_};
  cache_[eos] = {eos_id_};
}

void ClipTokenizer::map_symbols_to_tokens(const std::string& vocab_path) {
  const auto& byte_symbol = byte_level_symbols();
  for (int b = 0; b < 256; ++b)
    if (!vocab_.count(byte_symbol[static_cast<size_t>(b)]))
      throw CheckpointError(
          fmt::format("{}: the byte symbol '{}' (byte {}) is missing", vocab_path, byte_symbol[static_cast<size_t>(b)], b));
  symbol_token_.reserve(symbol_text_.size());
  for (const auto& symbol : symbol_text_) symbol_token_.push_back(token_id(symbol));
}

int64_t ClipTokenizer::token_id(const std::string& token) const {
  for (const auto& t : added_)
    if (t.content == token) return t.id;
  auto it = vocab_.find(token);
  return it == vocab_.end() ? unk_id_ : it->second;
}

std::vector<int64_t> ClipTokenizer::bpe(const std::string& word) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) return it->second;
  }
  // One symbol per code point (each a byte symbol); the last gets "</w>".
  std::vector<uint32_t> symbols;
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    const auto c = static_cast<unsigned char>(word[i]);
    if (c >= 0xF0) len = 4;
    else if (c >= 0xE0) len = 3;
    else if (c >= 0xC0) len = 2;
    const std::string symbol = word.substr(i, len) + (i + len >= word.size() ? "</w>" : "");
    symbols.push_back(symbol_ids_.at(symbol));
    i += len;
  }
  merges_.apply(symbols);
  std::vector<int64_t> ids;
  ids.reserve(symbols.size());
  for (uint32_t s : symbols) ids.push_back(symbol_token_[s]);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() < 100000) cache_[word] = ids;
  return ids;
}

std::vector<int64_t> ClipTokenizer::content_ids(const std::string& prompt) const {
  return content_ids_with(prompt, added_, added_trie_, [this](const std::string& text, std::vector<int64_t>& ids) {
    const auto& byte_symbol = byte_level_symbols();
    for (const auto& word : clip_pretokenize(clip_basic_clean(text))) {
      std::string mapped;
      for (unsigned char c : word) mapped += byte_symbol[c];
      for (int64_t id : bpe(mapped)) ids.push_back(id);
    }
  });
}

TokenizerOutput ClipTokenizer::encode(const std::string& prompt, int64_t max_length) const {
  if (max_length < 2)
    throw RequestError(
        fmt::format("CLIP tokenizer {}: max_length {} leaves no room for bos and eos", dir_, max_length));
  const int64_t bos = bos_id_, eos = eos_id_;
  return finish_encoding(content_ids(prompt), max_length, 2, pad_id_, [bos, eos](const std::vector<int64_t>& ids) {
    std::vector<int64_t> out;
    out.reserve(ids.size() + 2);
    out.push_back(bos);
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(eos);
    return out;
  });
}

}  // namespace tprun::text
