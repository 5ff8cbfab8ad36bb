#pragma once
// The merge loop of byte-pair encoding, shared by the CLIP tokenizer and the
// tokenizer.json BPE model. It runs as the tokenizers library runs it
// (models/bpe/word.rs, Word::merge_all without dropout): the adjacent pair of
// lowest merge rank is merged, the leftmost first among equal ranks, until no
// adjacent pair has a merge. For merge lists made by training (a merge's
// symbols come from earlier merges, as in openai's CLIP files and tprun's
// trainers) that is also openai CLIP's loop, which merges every occurrence of
// the lowest pair in one pass: the same symbols.

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tprun::text {

class BpeMerges {
 public:
  // The pair (left, right) merges into `merged` with `rank` (lower first). A
  // pair added again takes the new rank and result, as a repeated line of a
  // merges list does in tokenizers and transformers.
  void add(uint32_t left, uint32_t right, uint32_t merged, uint32_t rank);
  void reserve(size_t count) { merges_.reserve(count); }
  size_t size() const { return merges_.size(); }

  // Merges the symbol ids of one word in place.
  void apply(std::vector<uint32_t>& symbols) const;

 private:
  struct Merge {
    uint32_t rank;
    uint32_t merged;
  };
  static uint64_t key(uint32_t left, uint32_t right) { return (static_cast<uint64_t>(left) << 32) | right; }
  const Merge* find(uint32_t left, uint32_t right) const {
    auto it = merges_.find(key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  }

  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace tprun::text
