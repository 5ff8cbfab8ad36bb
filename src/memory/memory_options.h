#pragma once
// The memory features of diffusers' memory guide, as the manifest's [memory]
// table and `--memory KEY=VALUE` set them (memory/memory_table.h reads both,
// with file:line or the flag in every message). They travel as part of the
// options every model loads with (models::ModelOptions::memory); the
// families read the fields that concern them. Torch-free, below parallel/
// and models/ (the manifest parser's fuzz target links it).
//
// Every key is built: layerwise_casting, offload (+ offload_folder for a
// device map's disk), device_map, max_memory, vae_slicing, vae_tiling
// (+ vae_tile_sample_size, vae_tile_overlap), attention_chunk.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tprun::memory {

// Group offload (diffusers' enable_group_offload, and its model / sequential
// CPU offload under their names): each rank's weights live on a storage tier
// in groups, and a group comes to the compute device for its use, the
// others going back (memory/group_offloader.h).
struct OffloadOptions {
  // "" = off; "block_level" (each block list chunked into groups of
  // blocks_per_group; everything outside block lists one more group),
  // "leaf_level" (one group per layer), "model_level" (one group per
  // component: diffusers' model CPU offload). offload = "model" and
  // offload = "sequential" (leaf level, no prefetch) are the shorthands.
  std::string type;
  int64_t blocks_per_group = 1;
  std::string to = "cpu";  // "cpu" | "disk"
  // to = "disk": one safetensors file per group (this rank's slices) under
  // this folder, written once and reused while the checkpoint is unchanged.
  std::string disk_path;
  // Read the next group (in the order groups were last used) while the
  // current one computes: a reader thread on CPU, a side stream on CUDA.
  bool prefetch = false;
  bool enabled() const { return !type.empty(); }
};

// One device-map entry: a component ("transformer") or a module inside one
// ("transformer.single_transformer_blocks.10") and where its weights live:
// "cpu", "disk", or an accelerator index ("0", "cuda:0").
using DevicePlacement = std::pair<std::string, std::string>;

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
  // module name matches none of the skip patterns (RE2 syntax, linear-time
  // matching: runtime/user_pattern.h; searched as Python's re.search over
  // the module's name and every enclosing module's name). nullopt: diffusers'
  // DEFAULT_SKIP_MODULES_PATTERN; either way the family's own patterns are
  // added, and a layer declared to keep a dtype is never narrowed
  // (models/model_builder.h).
  std::string layerwise_storage;
  std::optional<std::vector<std::string>> layerwise_skip;
  OffloadOptions offload;
  // device_map = "balanced" (components placed largest first over the
  // rank's accelerator, then the host, then disk, under max_memory) or a
  // table of DevicePlacements (the longest matching name wins). Pipelines
  // without TP only. The pipeline resolves either form into
  // `placements` (component-qualified) before loading.
  std::string device_map_strategy;  // "" | "balanced"
  std::vector<DevicePlacement> device_map;
  // max_memory = { "0" = "20GB", "cpu" = "60GB" }: byte budgets per device
  // for "balanced" ("disk" takes the rest).
  std::vector<std::pair<std::string, uint64_t>> max_memory;
  // Where a device map's "disk" weights go (diffusers' offload_folder); the
  // offload table's disk_path when unset.
  std::string offload_folder;
  bool device_mapped() const { return !device_map_strategy.empty() || !device_map.empty(); }
};

// The storage dtypes layerwise_casting accepts.
const std::vector<std::string>& layerwise_storage_dtypes();

// The offload types the table form accepts.
const std::vector<std::string>& offload_types();
// Where a device map may place weights on a rank: "cpu", "disk", "N" or
// "cuda:N". Returns the accelerator index, -1 for cpu, -2 for disk; nullopt
// for anything else.
std::optional<int> device_map_target(const std::string& device);

// Bounds, checked by the parser.
constexpr int64_t kMaxAttentionChunk = int64_t{1} << 24;
constexpr int64_t kMinVaeTile = 8;
constexpr int64_t kMaxVaeTile = int64_t{1} << 16;
constexpr int64_t kMaxBlocksPerGroup = int64_t{1} << 20;
constexpr size_t kMaxDeviceMapEntries = 100000;

// One line for the log: "memory: vae_tiling (tiles of sample_size, overlap
// 0.25), attention_chunk 4096" or "memory: none".
std::string describe(const MemoryOptions& memory);

}  // namespace tprun::memory
