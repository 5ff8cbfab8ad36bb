// tokenizers' Unigram model and Precompiled normalizer (see unigram.h).
#include "text/unigram.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <unicode/brkiter.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include "runtime/error.h"
#include "text/tokenizer_common.h"

namespace tprun::text {
namespace {

// Length of the UTF-8 sequence that starts with byte `c` (valid text).
size_t utf8_length(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// darts-clone's unit fields.
uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFFu); }
bool unit_has_leaf(uint32_t u) { return ((u >> 8) & 1u) == 1u; }
uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }

// The extended grapheme clusters of valid UTF-8 `text`, as byte ranges.
std::vector<std::pair<size_t, size_t>> graphemes(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> out;
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::BreakIterator> it(icu::BreakIterator::createCharacterInstance(icu::Locale::getRoot(), status));
  if (U_FAILURE(status)) throw Error(Error::Kind::Internal, "ICU: no grapheme break iterator");
  it->setText(u);
  // UTF-16 boundaries -> byte offsets, walking the code points once.
  size_t byte = 0, start_byte = 0;
  int32_t unit = it->first();
  for (int32_t end = it->next(); end != icu::BreakIterator::DONE; end = it->next()) {
    while (unit < end) {
      unit += U16_LENGTH(u.char32At(unit));
      byte += utf8_length(static_cast<unsigned char>(text[byte]));
    }
    out.emplace_back(start_byte, byte);
    start_byte = byte;
  }
  return out;
}

}  // namespace

// ---- Precompiled -----------------------------------------------------------------

SpmPrecompiled::SpmPrecompiled(std::string charsmap, const std::string& what) {
  if (charsmap.size() < 4) throw CheckpointError(fmt::format("{}: precompiled_charsmap is shorter than 4 bytes", what));
  uint32_t trie_bytes = 0;
  for (int k = 3; k >= 0; --k) trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>(charsmap[static_cast<size_t>(k)]);
  if (trie_bytes % 4 != 0 || trie_bytes > charsmap.size() - 4 || trie_bytes == 0)
    throw CheckpointError(fmt::format("{}: precompiled_charsmap declares a trie of {} bytes in {} bytes", what,
                                      trie_bytes, charsmap.size()));
  trie_.resize(trie_bytes / 4);
  for (size_t i = 0; i < trie_.size(); ++i) {
    uint32_t v = 0;
    for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(charsmap[4 + 4 * i + static_cast<size_t>(k)]);
    trie_[i] = v;
  }
  replacements_ = charsmap.substr(4 + trie_bytes);
  try {
    decode_utf8(replacements_, what + ": precompiled_charsmap replacements");
  } catch (const Error& e) {
    throw CheckpointError(e.what());
  }
  // Lookups are bounds-checked (transform): a trie pointing outside itself or
  // past the replacements finds nothing there rather than reading out of range.
}

bool SpmPrecompiled::transform(std::string_view chunk, std::string_view& out) const {
  // darts' common prefix search; the first (shortest) result is the one used.
  size_t node = unit_offset(trie_[0]);
  for (unsigned char c : chunk) {
    if (c == 0) return false;
    node ^= c;
    if (node >= trie_.size()) return false;
    const uint32_t unit = trie_[node];
    if (unit_label(unit) != c) return false;
    node ^= unit_offset(unit);
    if (unit_has_leaf(unit)) {
      if (node >= trie_.size()) return false;
      const size_t begin = unit_value(trie_[node]);
      if (begin > replacements_.size()) return false;
      size_t end = replacements_.find('\0', begin);
      if (end == std::string::npos) end = replacements_.size();
      out = std::string_view(replacements_).substr(begin, end - begin);
      return true;
    }
  }
  return false;
}

std::string SpmPrecompiled::normalize(const std::string& text) const {
  if (trie_.empty()) return text;
  std::string out;
  out.reserve(text.size());
  const std::string_view all(text);
  for (const auto& [b, e] : graphemes(text)) {
    const std::string_view g = all.substr(b, e - b);
    std::string_view norm;
    if (g.size() < 6 && transform(g, norm)) {
      out.append(norm);
      continue;
    }
    for (size_t i = 0; i < g.size();) {
      const size_t n = utf8_length(static_cast<unsigned char>(g[i]));
      const std::string_view cp = g.substr(i, n);
      if (transform(cp, norm)) {
        out.append(norm);
      } else {
        out.append(cp);
      }
      i += n;
    }
  }
  return out;
}

// ---- Unigram ---------------------------------------------------------------------

UnigramModel::UnigramModel(std::vector<std::pair<std::string, double>> vocab, int64_t unk_id, const std::string& what)
    : vocab_(std::move(vocab)), unk_id_(unk_id) {
  if (vocab_.empty()) throw CheckpointError(fmt::format("{}: the Unigram vocabulary is empty", what));
  if (unk_id < 0 || unk_id >= static_cast<int64_t>(vocab_.size()))
    throw CheckpointError(fmt::format("{}: unk_id {} is outside the vocabulary of {} pieces", what, unk_id, vocab_.size()));
  double min_score = std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < vocab_.size(); ++id) {
    if (vocab_[id].first.empty()) throw CheckpointError(fmt::format("{}: vocabulary entry {} is an empty piece", what, id));
    if (!std::isfinite(vocab_[id].second))
      throw CheckpointError(fmt::format("{}: vocabulary entry {} ('{}') has a non-finite score", what, id, vocab_[id].first));
    min_score = std::min(min_score, vocab_[id].second);
  }
  unk_score_ = min_score - 10.0;  // tokenizers' K_UNK_PENALTY
  sorted_.resize(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) sorted_[id] = static_cast<int32_t>(id);
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return vocab_[a].first < vocab_[b].first; });
  for (size_t k = 1; k < sorted_.size(); ++k) {
    if (vocab_[sorted_[k]].first == vocab_[sorted_[k - 1]].first)
      throw CheckpointError(fmt::format("{}: piece '{}' appears twice in the vocabulary (ids {} and {})", what,
                                        vocab_[sorted_[k]].first, std::min(sorted_[k], sorted_[k - 1]),
                                        std::max(sorted_[k], sorted_[k - 1])));
  }
}

int64_t UnigramModel::id_of(std::string_view piece) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), piece,
                             [&](int32_t id, std::string_view p) { return vocab_[id].first < p; });
  return it != sorted_.end() && vocab_[*it].first == piece ? *it : -1;
}

void UnigramModel::encode(std::string_view text, std::vector<int64_t>& ids) const {
  struct Node {
    int64_t id = -1;
    double score = 0;
    int64_t starts_at = -1;  // -1: not reached
  };
  const size_t size = text.size();
  std::vector<Node> best(size + 1);
  best[0].starts_at = 0;
  for (size_t start = 0; start < size;) {
    const double here = best[start].score;
    const size_t mblen = utf8_length(static_cast<unsigned char>(text[start]));
    bool has_single = false;
    // Every piece that is a prefix of text[start..]: narrow the sorted range one byte at a time.
    auto lo = sorted_.begin(), hi = sorted_.end();
    for (size_t len = 1; start + len <= size && lo != hi; ++len) {
      const char c = text[start + len - 1];
      auto byte_at = [&](int32_t id) { return static_cast<unsigned char>(vocab_[id].first[len - 1]); };
      // Pieces shorter than len are before the others in the range (they are prefixes): skip them.
      lo = std::partition_point(lo, hi, [&](int32_t id) {
        return vocab_[id].first.size() < len || byte_at(id) < static_cast<unsigned char>(c);
      });
      hi = std::partition_point(lo, hi, [&](int32_t id) { return byte_at(id) <= static_cast<unsigned char>(c); });
      if (lo == hi) break;
      if (vocab_[*lo].first.size() != len) continue;
      const int32_t id = *lo;
      Node& target = best[start + len];
      const double candidate = vocab_[id].second + here;
      if (target.starts_at < 0 || candidate > target.score) {
        target.score = candidate;
        target.starts_at = static_cast<int64_t>(start);
        target.id = id;
      }
      if (len == mblen) has_single = true;
    }
    if (!has_single) {
      Node& target = best[start + mblen];
      const double candidate = unk_score_ + here;
      if (target.starts_at < 0 || candidate > target.score) {
        target.score = candidate;
        target.starts_at = static_cast<int64_t>(start);
        target.id = unk_id_;
      }
    }
    start += mblen;
  }
  // Back from the end; consecutive unknowns become one unk.
  std::vector<int64_t> reversed;
  bool in_unk = false;
  for (size_t end = size; end > 0;) {
    const Node& node = best[end];
    if (node.id == unk_id_) {
      if (!in_unk) reversed.push_back(unk_id_);
      in_unk = true;
    } else {
      reversed.push_back(node.id);
      in_unk = false;
    }
    end = static_cast<size_t>(node.starts_at);
  }
  ids.insert(ids.end(), reversed.rbegin(), reversed.rend());
}

}  // namespace tprun::text
