#pragma once
// The memory features of diffusers' memory guide, as the manifest's [memory]
// table and `--memory KEY=VALUE` set them (jobs/manifest.h parses both, with
// file:line or the flag in every message). This layer turns them into the
// options pipelines and models load with (memory_apply.h); models never
// name a feature. This header and its .cpp are torch-free (the manifest
// parser's fuzz target links them).
//
// Built:      vae_slicing, vae_tiling (+ vae_tile_sample_size, vae_tile_overlap),
//             attention_chunk, layerwise_casting
// Not built:  offload, device_map, max_memory: refused with
//             a message saying so, never accepted and ignored.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>


namespace tprun::memory {

struct MemoryOptions {
  bool vae_slicing = false;
  bool vae_tiling = false;
  int64_t vae_tile_sample_size = 0;  // pixels; 0: the VAE config's sample_size
  double vae_tile_overlap = 0.25;
  int64_t attention_chunk = 0;  // query tokens per attention call; 0: all at once
  // layerwise_casting = { storage = "float8_e4m3fn" | "float8_e5m2", skip = [regexes] }:
  // "" = off; skip nullopt = diffusers' default patterns (models::ModelOptions).
  std::string layerwise_storage;
  std::optional<std::vector<std::string>> layerwise_skip;
};

// The storage dtypes layerwise_casting accepts.
const std::vector<std::string>& layerwise_storage_dtypes();

// Every key the [memory] table may hold, built or not, in README order.
const std::vector<std::string>& memory_keys();
// False for the keys of memory_keys() that are not built yet.
bool memory_key_built(const std::string& key);

// Bounds, checked by the parser.
constexpr int64_t kMaxAttentionChunk = int64_t{1} << 24;  // = models::nn::kMaxAttentionChunk (checked)
constexpr int64_t kMinVaeTile = 8;
constexpr int64_t kMaxVaeTile = int64_t{1} << 16;

// One line for the log: "memory: vae_tiling (tiles of sample_size, overlap
// 0.25), attention_chunk 4096" or "memory: none".
std::string describe(const MemoryOptions& memory);

}  // namespace tprun::memory
