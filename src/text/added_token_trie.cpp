#include "text/added_token_trie.h"

#include <algorithm>

namespace tprun::text {

AddedTokenTrie::AddedTokenTrie() : nodes_(1) {}

int32_t AddedTokenTrie::child(int32_t node, unsigned char byte) const {
  if (node == 0) return root_edges_[byte];
  const auto& edges = nodes_[static_cast<size_t>(node)].edges;
  auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(byte, int32_t{0}),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  return it != edges.end() && it->first == byte ? it->second : 0;
}

void AddedTokenTrie::add(std::string_view content, int32_t index) {
  if (content.empty()) return;
  int32_t node = 0;
  for (const char ch : content) {
    const auto byte = static_cast<unsigned char>(ch);
    int32_t next = child(node, byte);
    if (next == 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      if (node == 0) {
        root_edges_[byte] = next;
      } else {
        auto& edges = nodes_[static_cast<size_t>(node)].edges;
        edges.insert(std::upper_bound(edges.begin(), edges.end(), std::make_pair(byte, int32_t{0}),
                                      [](const auto& a, const auto& b) { return a.first < b.first; }),
                     {byte, next});
      }
    }
    node = next;
  }
  if (nodes_[static_cast<size_t>(node)].index < 0) nodes_[static_cast<size_t>(node)].index = index;
}

std::pair<size_t, int32_t> AddedTokenTrie::longest_at(std::string_view text, size_t begin) const {
  std::pair<size_t, int32_t> best{begin, -1};
  int32_t node = 0;
  for (size_t i = begin; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node == 0) break;
    if (nodes_[static_cast<size_t>(node)].index >= 0) best = {i + 1, nodes_[static_cast<size_t>(node)].index};
  }
  return best;
}

std::optional<AddedTokenTrie::Match> AddedTokenTrie::find(std::string_view text, size_t from) const {
  if (empty()) return std::nullopt;
  for (size_t i = from; i < text.size(); ++i) {
    if (root_edges_[static_cast<unsigned char>(text[i])] == 0) continue;
    const auto [end, index] = longest_at(text, i);
    if (index >= 0) return Match{i, end, index};
  }
  return std::nullopt;
}

}  // namespace tprun::text
