#include "memory/memory_apply.h"

#include "models/nn_ops.h"

namespace tprun::memory {

static_assert(kMaxAttentionChunk == models::nn::kMaxAttentionChunk, "the parser's bound is the models' bound");

void apply(const MemoryOptions& m, models::ModelOptions& o) {
  o.vae_slicing = m.vae_slicing;
  o.vae_tiling = m.vae_tiling;
  o.vae_tile_sample_size = m.vae_tile_sample_size;
  o.vae_tile_overlap = m.vae_tile_overlap;
  o.attention_chunk = m.attention_chunk;
  o.layerwise_storage = m.layerwise_storage;
  o.layerwise_skip = m.layerwise_skip;
}

void apply(const MemoryOptions& m, pipelines::PipelineOptions& o) { apply(m, o.component_base); }

}  // namespace tprun::memory
