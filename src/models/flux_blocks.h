#pragma once
// Internal to the Flux transformer: the weights of each block as the
// construction declares them (flux_blocks.cpp) and the block forwards. Not a
// public API.

#include <string>
#include <vector>

#include "models/flux_transformer.h"
#include "models/mmdit_blocks.h"
#include "models/model_builder.h"
#include "models/nn_ops.h"
#include "parallel/parallel_linear.h"

namespace tprun::models {

struct DoubleBlockWeights {
  parallel::ParallelLinear norm1, norm1_context;  // AdaLayerNormZero modulations
  mmdit::JointAttentionWeights attn;
  parallel::ParallelLinear ff_in, ff_out;                  // ff.net.0.proj (colwise), ff.net.2 (rowwise)
  parallel::ParallelLinear ff_context_in, ff_context_out;  // ff_context.net.0.proj, ff_context.net.2
};

struct SingleBlockWeights {
  parallel::ParallelLinear norm;  // AdaLayerNormZeroSingle modulation
  parallel::Weight norm_q, norm_k;
  parallel::ParallelLinear to_q, to_k, to_v, proj_mlp;  // colwise
  parallel::ParallelLinear proj_out;                    // packed rowwise [inner, mlp]
};

struct FluxWeights {
  parallel::ParallelLinear x_embedder, context_embedder;
  // time_text_embed (CombinedTimestep[Guidance]TextProjEmbeddings).
  mmdit::MlpEmbedder timestep_embedder, guidance_embedder, text_embedder;
  bool has_guidance = false;
  std::vector<DoubleBlockWeights> doubles;
  std::vector<SingleBlockWeights> singles;
  parallel::ParallelLinear norm_out, proj_out;
};

// The whole model's declarations, in diffusers' module order.
FluxWeights declare_flux(const FluxConfig& config, bool shard_modulation, ModelBuilder& b);

// Block forwards. `mod` / `mod_context`: the block's full (reduced, biased)
// modulation vectors [B, 6*inner] (single: [B, 3*inner]). `attention_chunk`:
// MemoryOptions::attention_chunk (nn::attention; 0 = one call).
void double_block_forward(const DoubleBlockWeights& w, int64_t head_dim, const at::Tensor& mod,
                          const at::Tensor& mod_context, const nn::Rope& rope, at::Tensor& hidden,
                          at::Tensor& encoder, int64_t attention_chunk);
void single_block_forward(const SingleBlockWeights& w, int64_t head_dim, const at::Tensor& mod, const nn::Rope& rope,
                          at::Tensor& hidden, at::Tensor& encoder, int64_t attention_chunk);

}  // namespace tprun::models
