#include "text/clip_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "checkpoint/strict_json.h"
#include "text/clip_text_clean.h"
#include "runtime/error.h"

namespace tprun::text {
namespace fs = std::filesystem;

namespace {

// openai CLIP's bytes_to_unicode(): printable bytes map to themselves, the
// others to 256 + n in byte order.
void byte_symbols(std::string (&table)[256]) {
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    table[b].clear();
    append_utf8(table[b], printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++));
  }
}

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

  const nlohmann::json vocab = checkpoint::read_json_file(vocab_path.string(), "CLIP vocabulary");
  if (!vocab.is_object() || vocab.empty())
    throw CheckpointError(fmt::format("{}: not a non-empty JSON object of token -> id", vocab_path.string()));
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw CheckpointError(
          fmt::format("{}: token '{}' has id {}, not a non-negative integer", vocab_path.string(), token, id.dump()));
    vocab_[token] = id.get<int64_t>();
  }

  // transformers: read().strip().split("\n")[1:49152 - 256 - 2 + 1]; the first line is "#version: ...".
  std::string text = read_text_file(merges_path);
  const char* ws = " \t\n\r\f\v";
  const size_t b = text.find_first_not_of(ws), e = text.find_last_not_of(ws);
  text = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
  std::istringstream lines(text);
  std::string line;
  int64_t line_no = 0, rank = 0;
  constexpr int64_t kMaxLines = 49152 - 256 - 2 + 1;
  while (std::getline(lines, line) && ++line_no <= kMaxLines) {
    if (line_no == 1) continue;
    std::istringstream fields(line);
    std::string first, second, extra;
    if (!(fields >> first >> second) || (fields >> extra))
      throw CheckpointError(fmt::format("{}: line {} is not a merge of two symbols: '{}'", merges_path.string(),
                                        line_no, line));
    merge_ranks_[first + " " + second] = rank++;
  }
  if (rank == 0) throw CheckpointError(fmt::format("{}: holds no merges", merges_path.string()));

  const fs::path config_path = root / "tokenizer_config.json", map_path = root / "special_tokens_map.json";
  const nlohmann::json config = read_optional_json(config_path, "tokenizer config");
  const nlohmann::json special_map = read_optional_json(map_path, "special tokens map");
  added_ = parse_added_tokens(config, config_path.string());
  auto special = [&](const char* key, const char* fallback) {
    std::string s = special_token_string(special_map, map_path.string(), config, config_path.string(), key);
    if (s.empty()) s = fallback;
    bool known = vocab_.count(s) != 0;
    for (const auto& t : added_) known = known || t.content == s;
    if (!known)
      throw CheckpointError(fmt::format("{}: {} '{}' is neither in {} nor an added token", config_path.string(), key,
                                        s, vocab_path.string()));
    bool added = false;
    for (const auto& t : added_) added = added || t.content == s;
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
      throw CheckpointError(
          fmt::format("{}: model_max_length {} is not an integer >= 2", config_path.string(), m.dump()));
    model_max_length_ = m.get<int64_t>();
  }

  byte_symbols(byte_symbol_);
  for (int b = 0; b < 256; ++b)
    if (!vocab_.count(byte_symbol_[b]))
      throw CheckpointError(
          fmt::format("{}: the byte symbol '{}' (byte {}) is missing", vocab_path.string(), byte_symbol_[b], b));
  // transformers seeds the BPE cache with the bos and eos strings.
  cache_[bos] = {bos};
  cache_[eos] = {eos};
}

int64_t ClipTokenizer::token_id(const std::string& token) const {
  for (const auto& t : added_)
    if (t.content == token) return t.id;
  auto it = vocab_.find(token);
  return it == vocab_.end() ? unk_id_ : it->second;
}

std::vector<std::string> ClipTokenizer::bpe(const std::string& token) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(token);
    if (it != cache_.end()) return it->second;
  }
  // Split into code points (each a byte symbol); the last gets "</w>".
  std::vector<std::string> word;
  for (size_t i = 0; i < token.size();) {
    size_t len = 1;
    const auto c = static_cast<unsigned char>(token[i]);
    if (c >= 0xF0) len = 4;
    else if (c >= 0xE0) len = 3;
    else if (c >= 0xC0) len = 2;
    word.push_back(token.substr(i, len));
    i += len;
  }
  if (word.empty()) return {};
  word.back() += "</w>";
  if (word.size() == 1) return word;
  while (word.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max();
    std::string first, second;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merge_ranks_.find(word[i] + " " + word[i + 1]);
      if (it != merge_ranks_.end() && it->second < best) {
        best = it->second;
        first = word[i];
        second = word[i + 1];
      }
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() < 100000) cache_[token] = word;
  return word;
}

std::vector<int64_t> ClipTokenizer::content_ids(const std::string& prompt) const {
  return content_ids_with(prompt, added_, [this](const std::string& text, std::vector<int64_t>& ids) {
    for (const auto& word : clip_pretokenize(clip_basic_clean(text))) {
      std::string mapped;
      for (unsigned char c : word) mapped += byte_symbol_[c];
      for (const auto& symbol : bpe(mapped)) ids.push_back(token_id(symbol));
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
