#include "text/hf_bpe.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::text {

namespace {

[[noreturn]] void bad(const std::string& file, const std::string& field, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {} {}", file, field, what));
}

// An optional field that must be null (or absent) or equal `allowed`.
bool json_bool(const nlohmann::json& model, const char* key, bool fallback, const std::string& file) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad(file, fmt::format("model.{}", key), fmt::format("is {}, not a boolean", it->dump()));
  return it->get<bool>();
}

size_t utf8_len(unsigned char c) {
  if (c >= 0xF0) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC0) return 2;
  return 1;
}

}  // namespace

void BpeModel::check_options(const nlohmann::json& model, const std::string& file) {
  if (!model.is_object()) bad(file, "model", "is not an object");
  const auto type = model.find("type");
  if (type != model.end() && !(type->is_string() && type->get<std::string>() == "BPE"))
    bad(file, "model.type", fmt::format("is {}; tprun implements only \"BPE\"", type->dump()));
  if (type == model.end() && !model.contains("merges"))
    bad(file, "model.type", "is missing (and there are no merges); tprun implements only \"BPE\"");
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0)
      bad(file, "model.dropout", fmt::format("is {}; BPE dropout is random and tprun does not implement it", d->dump()));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it == model.end() || it->is_null()) continue;
    if (!it->is_string()) bad(file, fmt::format("model.{}", key), "is not a string or null");
    if (!it->get<std::string>().empty())
      bad(file, fmt::format("model.{}", key),
          fmt::format("is \"{}\"; tprun implements byte-level BPE without it", it->get<std::string>()));
  }
}

void BpeModel::read_vocab(const nlohmann::json& model, const std::string& file) {
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) bad(file, "model.vocab", "is missing or not an object of token -> id");
  if (static_cast<int64_t>(vocab->size()) > HfTokenizerLimits::kMaxVocab)
    bad(file, "model.vocab", fmt::format("has {} entries, above the limit {}", vocab->size(), HfTokenizerLimits::kMaxVocab));
  vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (static_cast<int64_t>(token.size()) > HfTokenizerLimits::kMaxTokenBytes)
      bad(file, "model.vocab", fmt::format("has a token of {} bytes, above the limit {}", token.size(),
                                           HfTokenizerLimits::kMaxTokenBytes));
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > HfTokenizerLimits::kMaxId)
      bad(file, fmt::format("model.vocab['{}']", token), fmt::format("is {}, not an id in [0, 2^31)", id.dump()));
    vocab_[token] = static_cast<uint32_t>(id.get<int64_t>());
    max_id_ = std::max(max_id_, id.get<int64_t>());
  }
}

void BpeModel::read_unk(const nlohmann::json& model, const std::string& file) {
  auto unk = model.find("unk_token");
  if (unk == model.end() || unk->is_null()) return;
  if (!unk->is_string()) bad(file, "model.unk_token", "is not a string or null");
  auto it = vocab_.find(unk->get<std::string>());
  // tokenizers fails only when an unknown character needs it; refuse up front.
  if (it == vocab_.end()) bad(file, "model.unk_token", fmt::format("'{}' is not in model.vocab", unk->get<std::string>()));
  unk_id_ = it->second;
}

void BpeModel::read_merges(const nlohmann::json& model, const std::string& file) {
  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) bad(file, "model.merges", "is missing or not an array");
  if (static_cast<int64_t>(merges->size()) > HfTokenizerLimits::kMaxMerges)
    bad(file, "model.merges", fmt::format("has {} entries, above the limit {}", merges->size(), HfTokenizerLimits::kMaxMerges));
  merges_.reserve(merges->size());
  uint32_t rank = 0;
  for (size_t k = 0; k < merges->size(); ++k) {
    const auto& entry = (*merges)[k];
    std::string a, b;
    if (entry.is_string()) {  // legacy "a b"
      const std::string& line = entry.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        bad(file, fmt::format("model.merges[{}]", k), fmt::format("'{}' is not two symbols separated by one space", line));
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      bad(file, fmt::format("model.merges[{}]", k), fmt::format("is {}, not \"a b\" or [\"a\", \"b\"]", entry.dump()));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), ij = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ij == vocab_.end())
      bad(file, fmt::format("model.merges[{}]", k),
          fmt::format("('{}', '{}'): '{}' is not in model.vocab", a, b,
                      ia == vocab_.end() ? a : ib == vocab_.end() ? b : a + b));
    merges_.add(ia->second, ib->second, ij->second, rank++);
  }
}

BpeModel BpeModel::from_json(const nlohmann::json& model, const std::string& file) {
  check_options(model, file);
  BpeModel m;
  m.fuse_unk_ = json_bool(model, "fuse_unk", false, file);
  m.byte_fallback_ = json_bool(model, "byte_fallback", false, file);
  m.ignore_merges_ = json_bool(model, "ignore_merges", false, file);
  m.read_vocab(model, file);
  m.read_unk(model, file);
  m.read_merges(model, file);
  if (m.byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      auto it = m.vocab_.find(fmt::format("<0x{:02X}>", b));
      if (it != m.vocab_.end()) {
        m.byte_token_[b] = it->second;
        m.has_byte_token_[b] = true;
      }
    }
  }
  return m;
}

int64_t BpeModel::token_id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::vector<uint32_t> BpeModel::initial_symbols(const std::string& piece) const {
  std::vector<uint32_t> symbols;
  symbols.reserve(piece.size());
  bool pending_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(piece[i])), piece.size() - i);
    const std::string ch = piece.substr(i, len);
    i += len;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      if (pending_unk) symbols.push_back(static_cast<uint32_t>(unk_id_));
      pending_unk = false;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && has_byte_token_[b];
      if (all) {
        // tokenizers adds the byte tokens without flushing a pending unk first.
        for (unsigned char b : ch) symbols.push_back(byte_token_[b]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) symbols.push_back(static_cast<uint32_t>(unk_id_));
      pending_unk = true;
    }
    // No unk token: tokenizers drops the character.
  }
  if (pending_unk) symbols.push_back(static_cast<uint32_t>(unk_id_));
  return symbols;
}

void BpeModel::tokenize(const std::string& piece, std::vector<int64_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<uint32_t> symbols = initial_symbols(piece);
  merges_.apply(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

}  // namespace tprun::text
