#include "pipelines/prompt_cache.h"

#include <ATen/core/Tensor.h>

namespace tprun::pipelines {

PromptCache::PromptCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

std::optional<models::TensorMap> PromptCache::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++stats_.misses;
    return std::nullopt;
  }
  ++stats_.hits;
  order_.splice(order_.begin(), order_, it->second.position);
  return it->second.value;
}

void PromptCache::put(const std::string& key, const models::TensorMap& value) {
  uint64_t bytes = 0;
  for (const auto& [name, t] : value) bytes += static_cast<uint64_t>(t.nbytes());
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > budget_ || entries_.count(key)) return;
  while (!order_.empty() && stats_.bytes + bytes > budget_) {
    auto victim = entries_.find(order_.back());
    stats_.bytes -= victim->second.bytes;
    entries_.erase(victim);
    order_.pop_back();
    ++stats_.evictions;
  }
  order_.push_front(key);
  entries_.emplace(key, Entry{value, bytes, order_.begin()});
  stats_.bytes += bytes;
}

PromptCacheStats PromptCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace tprun::pipelines
