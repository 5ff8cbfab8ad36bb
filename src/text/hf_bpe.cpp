#include "text/hf_bpe.h"

#include <algorithm>
#include <queue>

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

BpeModel BpeModel::from_json(const nlohmann::json& model, const std::string& file) {
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

  BpeModel m;
  m.fuse_unk_ = json_bool(model, "fuse_unk", false, file);
  m.byte_fallback_ = json_bool(model, "byte_fallback", false, file);
  m.ignore_merges_ = json_bool(model, "ignore_merges", false, file);

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) bad(file, "model.vocab", "is missing or not an object of token -> id");
  if (static_cast<int64_t>(vocab->size()) > HfTokenizerLimits::kMaxVocab)
    bad(file, "model.vocab", fmt::format("has {} entries, above the limit {}", vocab->size(), HfTokenizerLimits::kMaxVocab));
  m.vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (static_cast<int64_t>(token.size()) > HfTokenizerLimits::kMaxTokenBytes)
      bad(file, "model.vocab", fmt::format("has a token of {} bytes, above the limit {}", token.size(),
                                           HfTokenizerLimits::kMaxTokenBytes));
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > HfTokenizerLimits::kMaxId)
      bad(file, fmt::format("model.vocab['{}']", token), fmt::format("is {}, not an id in [0, 2^31)", id.dump()));
    m.vocab_[token] = static_cast<uint32_t>(id.get<int64_t>());
    m.max_id_ = std::max(m.max_id_, id.get<int64_t>());
  }

  if (auto unk = model.find("unk_token"); unk != model.end() && !unk->is_null()) {
    if (!unk->is_string()) bad(file, "model.unk_token", "is not a string or null");
    auto it = m.vocab_.find(unk->get<std::string>());
    // tokenizers fails only when an unknown character needs it; refuse up front.
    if (it == m.vocab_.end())
      bad(file, "model.unk_token", fmt::format("'{}' is not in model.vocab", unk->get<std::string>()));
    m.unk_id_ = it->second;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) bad(file, "model.merges", "is missing or not an array");
  if (static_cast<int64_t>(merges->size()) > HfTokenizerLimits::kMaxMerges)
    bad(file, "model.merges", fmt::format("has {} entries, above the limit {}", merges->size(), HfTokenizerLimits::kMaxMerges));
  m.merges_.reserve(merges->size());
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
    auto ia = m.vocab_.find(a), ib = m.vocab_.find(b), ij = m.vocab_.find(a + b);
    if (ia == m.vocab_.end() || ib == m.vocab_.end() || ij == m.vocab_.end())
      bad(file, fmt::format("model.merges[{}]", k),
          fmt::format("('{}', '{}'): '{}' is not in model.vocab", a, b,
                      ia == m.vocab_.end() ? a : ib == m.vocab_.end() ? b : a + b));
    // Like tokenizers' HashMap collect, a repeated pair keeps its last rank.
    m.merges_[pair_key(ia->second, ib->second)] = Merge{rank, ij->second};
    ++rank;
  }

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

void BpeModel::tokenize(const std::string& piece, std::vector<int64_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // merge_word: one symbol per character.
  struct Symbol {
    uint32_t id;
    int64_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto add = [&](uint32_t id) {
    const int64_t index = static_cast<int64_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back(Symbol{id, index - 1, -1, true});
  };
  bool pending_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(piece[i])), piece.size() - i);
    const std::string ch = piece.substr(i, len);
    i += len;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      if (pending_unk) add(static_cast<uint32_t>(unk_id_));
      pending_unk = false;
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && has_byte_token_[b];
      if (all) {
        // tokenizers adds the byte tokens without flushing a pending unk first.
        for (unsigned char b : ch) add(byte_token_[b]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) add(static_cast<uint32_t>(unk_id_));
      pending_unk = true;
    }
    // No unk token: tokenizers drops the character.
  }
  if (pending_unk) add(static_cast<uint32_t>(unk_id_));
  if (symbols.empty()) return;

  struct Entry {
    uint32_t rank;
    int64_t pos;
    uint32_t new_id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  auto find_merge = [&](uint32_t a, uint32_t b) -> const Merge* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k)
    if (const Merge* mg = find_merge(symbols[k].id, symbols[k + 1].id))
      queue.push(Entry{mg->rank, static_cast<int64_t>(k), mg->new_id});
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    const size_t next_pos = static_cast<size_t>(left.next);
    const Symbol right = symbols[next_pos];
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // an expired entry
    left.id = top.new_id;
    left.next = right.next;
    symbols[next_pos].alive = false;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) {
      const Symbol& prev = symbols[static_cast<size_t>(left.prev)];
      if (const Merge* mg = find_merge(prev.id, left.id)) queue.push(Entry{mg->rank, left.prev, mg->new_id});
    }
    if (left.next >= 0) {
      const Symbol& next = symbols[static_cast<size_t>(left.next)];
      if (const Merge* mg = find_merge(left.id, next.id)) queue.push(Entry{mg->rank, top.pos, mg->new_id});
    }
  }
  for (const auto& s : symbols)
    if (s.alive) ids.push_back(s.id);
}

}  // namespace tprun::text
