#include "text/bpe_merges.h"

#include <queue>

namespace tprun::text {

void BpeMerges::add(uint32_t left, uint32_t right, uint32_t merged, uint32_t rank) {
  merges_[key(left, right)] = Merge{rank, merged};
}

void BpeMerges::apply(std::vector<uint32_t>& ids) const {
  if (ids.size() < 2) return;
  // The word as a linked list; a merge keeps the left symbol and unlinks the right one.
  struct Symbol {
    uint32_t id;
    int64_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(ids.size());
  for (size_t k = 0; k < ids.size(); ++k)
    symbols.push_back(Symbol{ids[k], static_cast<int64_t>(k) - 1, k + 1 < ids.size() ? static_cast<int64_t>(k) + 1 : -1, true});

  // Candidate merges by rank, then position; an entry whose pair changed since it was queued is skipped.
  struct Candidate {
    uint32_t rank;
    int64_t pos;
    uint32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int64_t pos) {
    const Symbol& left = symbols[static_cast<size_t>(pos)];
    if (left.next < 0) return;
    if (const Merge* m = find(left.id, symbols[static_cast<size_t>(left.next)].id)) queue.push(Candidate{m->rank, pos, m->merged});
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k) push(static_cast<int64_t>(k));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    const size_t right_pos = static_cast<size_t>(left.next);
    const Merge* current = find(left.id, symbols[right_pos].id);
    if (current == nullptr || current->merged != top.merged) continue;  // an expired entry
    left.id = top.merged;
    left.next = symbols[right_pos].next;
    symbols[right_pos].alive = false;
    if (left.next >= 0) symbols[static_cast<size_t>(left.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  ids.clear();
  for (const auto& s : symbols)
    if (s.alive) ids.push_back(s.id);
}

}  // namespace tprun::text
