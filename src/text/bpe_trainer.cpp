#include "text/bpe_trainer.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "text/byte_level.h"
#include "text/clip_text_clean.h"
#include "text/tokenizer_common.h"
#include "runtime/error.h"

namespace tprun::text {

namespace {

using Pair = std::pair<std::string, std::string>;

struct PairHash {
  size_t operator()(const Pair& p) const {
    return std::hash<std::string>()(p.first) * 1000003u ^ std::hash<std::string>()(p.second);
  }
};

// Distinct words of the texts with their counts, in first-seen order.
std::vector<BpeWord> count_words(const std::vector<std::string>& texts, const std::vector<std::string>& byte_symbol) {
  std::vector<BpeWord> words;
  std::unordered_map<std::string, size_t> index;
  for (const auto& text : texts) {
    decode_utf8(text, "BPE training text");  // RequestError for invalid UTF-8
    for (const auto& w : clip_pretokenize(clip_basic_clean(text))) {
      auto [it, added] = index.emplace(w, words.size());
      if (added) {
        BpeWord word;
        for (unsigned char b : w) word.symbols.push_back(byte_symbol[b]);
        word.symbols.back() += "</w>";
        words.push_back(std::move(word));
      }
      ++words[it->second].count;
    }
  }
  return words;
}

// Replaces every non-overlapping occurrence of `pair`, left to right.
void merge_in(BpeWord& word, const Pair& pair) {
  std::vector<std::string> out;
  out.reserve(word.symbols.size());
  for (size_t i = 0; i < word.symbols.size(); ++i) {
    if (i + 1 < word.symbols.size() && word.symbols[i] == pair.first && word.symbols[i + 1] == pair.second) {
      out.push_back(pair.first + pair.second);
      ++i;
    } else {
      out.push_back(word.symbols[i]);
    }
  }
  word.symbols = std::move(out);
}

}  // namespace

void learn_bpe_merges(std::vector<BpeWord>& words, int64_t num_merges, std::vector<Pair>& merges,
                      std::vector<std::string>& tokens) {
  std::unordered_set<std::string> known(tokens.begin(), tokens.end());
  std::unordered_set<Pair, PairHash> banned;  // joined symbol already a token
  while (static_cast<int64_t>(merges.size()) < num_merges) {
    std::unordered_map<Pair, int64_t, PairHash> counts;
    for (const auto& w : words)
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) counts[{w.symbols[i], w.symbols[i + 1]}] += w.count;
    const Pair* best = nullptr;
    int64_t best_count = 0;
    for (const auto& [pair, count] : counts) {
      if (count < 2 || count < best_count || banned.count(pair)) continue;  // a merge occurs at least twice
      if (count > best_count || pair < *best) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;
    const Pair pair = *best;
    const std::string joined = pair.first + pair.second;
    if (!known.insert(joined).second) {
      banned.insert(pair);
      continue;
    }
    merges.push_back(pair);
    tokens.push_back(joined);
    for (auto& w : words) merge_in(w, pair);
  }
}

BpeVocabulary train_clip_bpe(const std::vector<std::string>& texts, int64_t num_merges) {
  if (num_merges < 0) throw ConfigError(fmt::format("BPE training: number of merges {} is negative", num_merges));
  const std::vector<std::string>& byte_symbol = byte_level_symbols();
  // bytes_to_unicode()'s dict order: the printable bytes, then the others;
  // that is the symbols' code point (= UTF-8 byte) order.
  std::vector<std::string> ordered = byte_symbol;
  std::sort(ordered.begin(), ordered.end());
  BpeVocabulary vocab;
  for (const auto& s : ordered) vocab.tokens.push_back(s);
  for (const auto& s : ordered) vocab.tokens.push_back(s + "</w>");

  std::vector<BpeWord> words = count_words(texts, byte_symbol);
  learn_bpe_merges(words, num_merges, vocab.merges, vocab.tokens);
  vocab.tokens.push_back("<|startoftext|>");
  vocab.tokens.push_back("<|endoftext|>");
  return vocab;
}

}  // namespace tprun::text
