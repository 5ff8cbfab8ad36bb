#pragma once
// Internal to the Wan transformer: the weights as the construction declares
// them (in diffusers' state_dict order), the TP-aware across-heads RMSNorm
// and the block forward. Not a public API.
//
// A WanTransformerBlock with x [B, S, D] (compute dtype), the text c
// [B, S_txt, D] and m = scale_shift_table + timestep_proj [B, 6, D] (fp32),
// chunked into (shift, scale, gate, c_shift, c_scale, c_gate):
//   x = x + gate   * attn1(LN(x) * (1 + scale) + shift)          RoPE, no mask
//   x = x +          attn2(norm2(x), c)                          norm2: LN with affine
//                                                                (identity without
//                                                                cross_attn_norm)
//   x = x + c_gate * ffn(LN(x) * (1 + c_scale) + c_shift)
// LN: LayerNorm without affine (eps), in fp32. Each attention: q = to_q(.),
// k = to_k(kv), v = to_v(kv); q = norm_q(q), k = norm_k(k) (RMSNorm over all
// D channels, fp32, rounded once); heads split; RoPE on q, k (attn1 only);
// SDPA with scale 1 / sqrt(head_dim); to_out.0. ffn: net.2(gelu_tanh(
// net.0.proj(.))). Every linear has a bias.

#include <string>
#include <vector>

#include "models/model_builder.h"
#include "models/nn_ops.h"
#include "models/wan_transformer.h"
#include "parallel/parallel_linear.h"

namespace tprun::models {

// WanAttention: the projections and the across-heads norms (their weight's
// slice of this rank's heads).
struct WanAttentionWeights {
  parallel::ParallelLinear to_q, to_k, to_v, to_out;
  parallel::Weight norm_q, norm_k;
};

struct WanBlockWeights {
  parallel::Weight scale_shift_table;  // [1, 6, D], fp32
  WanAttentionWeights attn1, attn2;
  Affine norm2;  // fp32; undefined without cross_attn_norm
  parallel::ParallelLinear ffn_in, ffn_out;  // ffn.net.0.proj (colwise), ffn.net.2 (rowwise)
};

struct WanWeights {
  parallel::Weight scale_shift_table;             // [1, 2, D], fp32
  parallel::Weight patch_weight, patch_bias;      // Conv3d [D, C_in, pt, ph, pw], [D]
  parallel::ParallelLinear time_1, time_2;        // condition_embedder.time_embedder (fp32)
  parallel::ParallelLinear time_proj;             // [6 D, D]
  parallel::ParallelLinear text_1, text_2;        // condition_embedder.text_embedder
  std::vector<WanBlockWeights> blocks;
  parallel::ParallelLinear proj_out;
};

// The whole model's declarations, in diffusers' state_dict order.
WanWeights declare_wan(const WanTransformerConfig& config, bool shard_modulation, ModelBuilder& b);

// torch.nn.RMSNorm over a vector of `full` channels of which x and y [..., n]
// hold this rank's n (the colwise q and k): the per-token sums of squares in
// fp32 reduced over the TP group with ONE AllReduce (none at tp 1), then
// x * rsqrt(sum / full + eps) * weight in fp32, rounded once to x's dtype.
// Returns the two normed tensors.
std::pair<at::Tensor, at::Tensor> rms_norm_across_heads(const at::Tensor& x, const at::Tensor& x_weight,
                                                        const at::Tensor& y, const at::Tensor& y_weight,
                                                        int64_t full, double eps, const parallel::TpContext& tp);

// One block over this rank's heads: `mod` [B, 6, D] fp32 (the block's
// scale_shift_table not yet added), `text` [B, S_txt, D], `rope` the grid's
// tables; `hidden` [B, S, D] updated in place.
void wan_block_forward(const WanBlockWeights& w, const WanTransformerConfig& config, const at::Tensor& mod,
                       const at::Tensor& text, const nn::Rope& rope, at::Tensor& hidden, int64_t attention_chunk);

}  // namespace tprun::models
