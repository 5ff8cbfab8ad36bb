#pragma once
// A small byte-level BPE trainer for CLIP-style tokenizers (openai's layout):
// text is cleaned and split into words exactly as ClipTokenizer does it
// (clip_basic_clean + clip_pretokenize), each word becomes its UTF-8 bytes as
// byte symbols with "</w>" on the last one, and the most frequent adjacent
// pair is merged until `num_merges` merges are learned or no pair occurs
// twice. Ties go to the smallest pair (first symbol, then second, byte
// order), so the result depends on the text alone.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tprun::text {

struct BpeVocabulary {
  // Merge rank order (merges.txt lines after "#version: 0.2").
  std::vector<std::pair<std::string, std::string>> merges;
  // Tokens by id: 256 byte symbols in bytes_to_unicode()'s order (printable
  // bytes first: "!" = 0, ..., "Ġ" (space) = 220), the same 256
  // with "</w>", one per merge (the two symbols joined), then the special
  // tokens ("<|startoftext|>", "<|endoftext|>").
  std::vector<std::string> tokens;
};

// A distinct word of the training text, as symbols, with its count.
struct BpeWord {
  std::vector<std::string> symbols;
  int64_t count = 0;
};

// The merge loop both trainers share: the most frequent adjacent pair of
// `words` (counted with their counts, at least twice; ties to the smallest
// pair) is merged in place, appended to `merges` and its joined symbol to
// `tokens`, until `merges` holds `num_merges` or no pair qualifies. A pair
// whose joined symbol is already in `tokens` is never merged.
void learn_bpe_merges(std::vector<BpeWord>& words, int64_t num_merges,
                      std::vector<std::pair<std::string, std::string>>& merges, std::vector<std::string>& tokens);

// Learns at most `num_merges` merges from `texts`. A pair whose joined symbol
// already is a token is never merged (every token keeps one id). Throws
// ConfigError for a negative `num_merges`, RequestError for invalid UTF-8.
BpeVocabulary train_clip_bpe(const std::vector<std::string>& texts, int64_t num_merges);

}  // namespace tprun::text
