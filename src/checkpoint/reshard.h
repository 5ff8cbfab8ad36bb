#pragma once
// Re-sharding a component's safetensors weights (`tprun shard`): diffusers'
// file names, greedy filling in saved order up to a maximum shard size (a
// larger tensor gets a shard of its own), the index with metadata.total_size,
// config.json and the other small files copied. Tensor bytes are copied in
// bounded chunks; every file is written atomically.

#include <cstdint>
#include <string>

namespace tprun::checkpoint {

struct ReshardOptions {
  uint64_t max_shard_bytes = 5000000000ull;  // "5GB", diffusers' default
  std::string variant;                       // read and write this variant
  bool force = false;                        // overwrite files in a non-empty dst
};

struct ReshardSummary {
  size_t shards = 0;
  size_t tensors = 0;
  uint64_t bytes = 0;
};

ReshardSummary reshard_component(const std::string& src, const std::string& dst, const ReshardOptions& options);

}  // namespace tprun::checkpoint
