#pragma once
// Internal to the FLUX.2 transformer: the weights of each block as the
// construction declares them (flux2_blocks.cpp) and the block forwards. Not a
// public API.

#include <string>
#include <vector>

#include "models/flux2_transformer.h"
#include "models/mmdit_blocks.h"
#include "models/model_builder.h"
#include "models/nn_ops.h"
#include "parallel/parallel_linear.h"

namespace tprun::models {

struct Flux2DoubleBlockWeights {
  mmdit::JointAttentionWeights attn;
  // ff.linear_in (packed colwise [mlp, mlp]: gate | up), ff.linear_out (rowwise).
  parallel::ParallelLinear ff_in, ff_out;
  parallel::ParallelLinear ff_context_in, ff_context_out;  // ff_context.linear_in / linear_out
};

struct Flux2SingleBlockWeights {
  parallel::ParallelLinear to_qkv_mlp;  // packed colwise [inner, inner, inner, mlp, mlp]
  parallel::Weight norm_q, norm_k;
  parallel::ParallelLinear to_out;  // packed rowwise [inner, mlp]
};

struct Flux2Weights {
  mmdit::MlpEmbedder timestep_embedder, guidance_embedder;  // time_guidance_embed
  bool has_guidance = false;
  // Flux2Modulation linears, shared by every block of their kind.
  parallel::ParallelLinear mod_img, mod_txt, mod_single;
  parallel::ParallelLinear x_embedder, context_embedder;
  std::vector<Flux2DoubleBlockWeights> doubles;
  std::vector<Flux2SingleBlockWeights> singles;
  parallel::ParallelLinear norm_out, proj_out;
};

// The whole model's declarations, in diffusers' module (state_dict) order.
Flux2Weights declare_flux2(const Flux2Config& config, bool shard_modulation, ModelBuilder& b);

// Block forwards. `mod_img` / `mod_txt`: the full double-stream modulation
// vectors [B, 6*inner] (two sets of shift, scale, gate); `mod`: the single
// stream's [B, 3*inner]. `joint` is the single blocks' [txt, img] stream.
// `attention_chunk`: MemoryOptions::attention_chunk (nn::attention; 0 = one call).
void flux2_double_block_forward(const Flux2DoubleBlockWeights& w, const Flux2Config& config,
                                const at::Tensor& mod_img, const at::Tensor& mod_txt, const nn::Rope& rope,
                                at::Tensor& hidden, at::Tensor& encoder, int64_t attention_chunk);
void flux2_single_block_forward(const Flux2SingleBlockWeights& w, const Flux2Config& config, const at::Tensor& mod,
                                const nn::Rope& rope, at::Tensor& joint, int64_t attention_chunk);

}  // namespace tprun::models
