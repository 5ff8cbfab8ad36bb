#pragma once
// A bounded cache of prompt embeddings within one process (one replica's
// rank): batches often hold one prompt over many seeds, and a 24B text
// encoder makes each encode a real share of a request. Keyed by everything
// the embeddings depend on (the pipeline builds the key: prompt, negative
// prompt, max_sequence_length, ...); least recently used entries go first
// when the byte budget is exceeded. Encoding is deterministic, so a hit
// returns exactly what a fresh encode would.

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "models/tensor_map.h"

namespace tprun::pipelines {

struct PromptCacheStats {
  int64_t hits = 0;    // encodes saved
  int64_t misses = 0;  // encodes run
  int64_t evictions = 0;
  uint64_t bytes = 0;  // held now
};

class PromptCache {
 public:
  // budget_bytes 0 disables the cache (every lookup misses, nothing is kept).
  explicit PromptCache(uint64_t budget_bytes = uint64_t{512} << 20);

  // The entry for `key` (counted as a hit), or nullopt (counted as a miss).
  std::optional<models::TensorMap> get(const std::string& key);
  // Keeps `value` (its tensors are shared, not copied); entries larger than
  // the whole budget are not kept.
  void put(const std::string& key, const models::TensorMap& value);
  PromptCacheStats stats() const;

 private:
  using Order = std::list<std::string>;
  struct Entry {
    models::TensorMap value;
    uint64_t bytes = 0;
    Order::iterator position;
  };
  uint64_t budget_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  Order order_;  // most recently used first
  PromptCacheStats stats_;
};

}  // namespace tprun::pipelines
