#pragma once
// Finding added tokens in a text: a byte trie of their contents, built once
// when a tokenizer loads and only read afterwards (safe from several threads).
// Matches are leftmost-longest and non-overlapping, the order tokenizers'
// AddedVocabulary (aho-corasick, MatchKind::LeftmostLongest) and transformers'
// slow-tokenizer split find them: the first text position where some token
// starts wins, and there the longest token; the search then goes on after it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tprun::text {

class AddedTokenTrie {
 public:
  AddedTokenTrie();

  // Adds `content` (non-empty) as token number `index`; a content added again
  // keeps its first index (the first of equal tokens wins, as before).
  void add(std::string_view content, int32_t index);

  struct Match {
    size_t begin = 0, end = 0;  // byte offsets, [begin, end)
    int32_t index = -1;         // as given to add()
  };
  // The leftmost match that begins at or after `from`, the longest there.
  std::optional<Match> find(std::string_view text, size_t from) const;

  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> edges;  // byte -> child, sorted by byte
    int32_t index = -1;                                    // a token ends here
  };
  int32_t child(int32_t node, unsigned char byte) const;
  // The longest token that starts at `begin`: its end and index, or index -1.
  std::pair<size_t, int32_t> longest_at(std::string_view text, size_t begin) const;

  std::vector<Node> nodes_;                // nodes_[0] is the root
  std::array<int32_t, 256> root_edges_{};  // the root's children by first byte (0: none)
};

}  // namespace tprun::text
