#pragma once
// Internal to the Flux transformer: the weights of each block as the
// construction declares them (flux_blocks.cpp) and the block forwards. Not a
// public API.

#include <string>
#include <vector>

#include "models/flux_transformer.h"
#include "models/model_builder.h"
#include "models/nn_ops.h"
#include "parallel/parallel_linear.h"

namespace tprun::models {

struct DoubleBlockWeights {
  parallel::ParallelLinear norm1, norm1_context;  // AdaLayerNormZero modulations
  parallel::Weight norm_q, norm_k, norm_added_q, norm_added_k;
  parallel::ParallelLinear to_q, to_k, to_v, add_q, add_k, add_v;  // colwise
  parallel::ParallelLinear to_out, to_add_out;                      // rowwise
  parallel::ParallelLinear ff_in, ff_out, ffc_in, ffc_out;          // colwise, rowwise
};

struct SingleBlockWeights {
  parallel::ParallelLinear norm;  // AdaLayerNormZeroSingle modulation
  parallel::Weight norm_q, norm_k;
  parallel::ParallelLinear to_q, to_k, to_v, proj_mlp;  // colwise
  parallel::ParallelLinear proj_out;                    // packed rowwise [inner, mlp]
};

struct FluxWeights {
  parallel::ParallelLinear x_embedder, context_embedder;
  parallel::ParallelLinear t_lin1, t_lin2, g_lin1, g_lin2, p_lin1, p_lin2;
  bool has_guidance = false;
  std::vector<DoubleBlockWeights> doubles;
  std::vector<SingleBlockWeights> singles;
  parallel::ParallelLinear norm_out, proj_out;
};

// The whole model's declarations, in diffusers' module order.
FluxWeights declare_flux(const FluxConfig& config, bool shard_modulation, ModelBuilder& b);

// Block forwards. `mod` / `mod_context`: the block's full (reduced, biased)
// modulation vectors [B, 6*inner] (single: [B, 3*inner]). `attention_chunk`:
// ModelOptions::attention_chunk (nn::attention; 0 = one call).
void double_block_forward(const DoubleBlockWeights& w, int64_t head_dim, const at::Tensor& mod,
                          const at::Tensor& mod_context, const nn::Rope& rope, at::Tensor& hidden,
                          at::Tensor& encoder, int64_t attention_chunk);
void single_block_forward(const SingleBlockWeights& w, int64_t head_dim, const at::Tensor& mod, const nn::Rope& rope,
                          at::Tensor& hidden, at::Tensor& encoder, int64_t attention_chunk);

}  // namespace tprun::models
