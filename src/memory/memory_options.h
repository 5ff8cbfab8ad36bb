#pragma once
// The memory features of diffusers' memory guide, as the manifest's [memory]
// table and `--memory KEY=VALUE` set them (jobs/manifest.h parses both, with
// file:line or the flag in every message). They travel as part of the
// options every model loads with (models::ModelOptions::memory); the
// families read the fields that concern them. Torch-free, below parallel/
// and models/ (the manifest parser's fuzz target links it).
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
  // VAEs, as diffusers' enable_slicing() / enable_tiling(): a batch decoded
  // and encoded one image at a time; images larger than a tile decoded and
  // encoded in overlapping, blended tiles (models/vae_tiling.h). Tile side
  // in pixels: 0 = the config's sample_size; overlap: diffusers' 0.25.
  bool vae_slicing = false;
  bool vae_tiling = false;
  int64_t vae_tile_sample_size = 0;
  double vae_tile_overlap = 0.25;
  // Attention with the queries in chunks of at most this many tokens, each
  // against all keys / values (exact up to floating-point order), in every
  // attention of a model (models/nn_ops.h "attention"). 0: one call over all
  // queries. A load refuses a value outside [0, kMaxAttentionChunk] and logs
  // the attention backend and this choice.
  int64_t attention_chunk = 0;
  // layerwise_casting = { storage, skip }: weights kept in a narrower storage
  // dtype and up-cast to the compute dtype at each use (diffusers'
  // enable_layerwise_casting): "" = off, "float8_e4m3fn" | "float8_e5m2".
  // Applies to the weight and bias of Linear, Conv and Embedding layers whose
  // module name matches none of the skip patterns (std::regex ECMAScript,
  // searched as Python's re.search over the module's name and every
  // enclosing module's name). nullopt: diffusers'
  // DEFAULT_SKIP_MODULES_PATTERN; either way the family's own patterns are
  // added, and a layer declared to keep a dtype is never narrowed
  // (models/model_builder.h).
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
constexpr int64_t kMaxAttentionChunk = int64_t{1} << 24;
constexpr int64_t kMinVaeTile = 8;
constexpr int64_t kMaxVaeTile = int64_t{1} << 16;

// One line for the log: "memory: vae_tiling (tiles of sample_size, overlap
// 0.25), attention_chunk 4096" or "memory: none".
std::string describe(const MemoryOptions& memory);

}  // namespace tprun::memory
