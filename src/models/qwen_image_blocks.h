#pragma once
// Internal to the Qwen-Image transformer: the weights as the construction
// declares them (in diffusers' state_dict order), the timestep embedding and
// the dual-stream block forward. Not a public API.
//
// A QwenImageTransformerBlock, per stream s in {img, txt}, with temb the
// timestep embedding [B, D]:
//   (shift1, scale1, gate1, shift2, scale2, gate2) = s_mod.1(silu(temb))   (6 chunks of D)
//   (zero_cond_t: the image stream's from temb of [t, 0]; tokens of the first
//    image take the first set, the conditioning images' tokens the second)
//   x_s = LayerNorm(x_s) * (1 + scale1) + shift1       (LayerNorm without affine, eps 1e-6)
//   (a_img, a_txt) = joint attention over [txt, img] (QK RMSNorm per head,
//                    RoPE, padded text keys masked), to_out.0 / to_add_out
//   x_s += gate1 * a_s
//   x_s += gate2 * s_mlp(LayerNorm(x_s) * (1 + scale2) + shift2)
// with s_mlp = net.2(gelu_tanh(net.0.proj(.))) of hidden 4 * D. Every linear
// has a bias. Under TP both streams' attention outputs share one AllReduce,
// and both MLPs' net.2 another (the text MLP does not need the image MLP's
// result, so the two row-wise partial sums reduce together).

#include <string>
#include <vector>

#include "models/mmdit_blocks.h"
#include "models/model_builder.h"
#include "models/nn_ops.h"
#include "models/qwen_image_transformer.h"
#include "parallel/parallel_linear.h"

namespace tprun::models {

// diffusers' FeedForward(dim, activation_fn "gelu-approximate"): net.0.proj
// (colwise), net.2 (rowwise).
struct QwenMlpWeights {
  parallel::ParallelLinear proj, out;
};

struct QwenBlockWeights {
  parallel::ParallelLinear img_mod, txt_mod;  // img_mod.1 / txt_mod.1 [6 D, D]
  mmdit::JointAttentionWeights attn;
  QwenMlpWeights img_mlp, txt_mlp;
};

struct QwenImageWeights {
  mmdit::MlpEmbedder timestep_embedder;  // time_text_embed.timestep_embedder
  parallel::Weight addition_t_embedding;  // [2, D] when use_additional_t_cond
  parallel::Weight txt_norm;              // [joint_attention_dim]
  parallel::ParallelLinear img_in, txt_in;
  std::vector<QwenBlockWeights> blocks;
  parallel::ParallelLinear norm_out, proj_out;
};

// The whole model's declarations, in diffusers' module (state_dict) order.
QwenImageWeights declare_qwen_image(const QwenImageConfig& config, bool shard_modulation, ModelBuilder& b);

// QwenTimestepProjEmbeddings' projection: Timesteps(256, flip_sin_to_cos,
// shift 0, scale 1000) of `t` already in the compute dtype (so a bf16 model
// sees the bf16-rounded timestep, as diffusers' forward casts it), as
// diffusers' embeddings.get_timestep_embedding does it: frequencies
// exp(-ln(10000) i / 128) in fp32, angle = (t * frequency) * 1000 in fp32
// (this order: not t * 1000 first), [cos, sin].
// Returns fp32 [B, channels] (channels even: 256 in every Qwen-Image).
at::Tensor qwen_timestep_features(const at::Tensor& t, int64_t channels);

// One block over this rank's heads. `img_mod` / `txt_mod`: the block's
// modulations [B, 6 D]; with zero_cond_t `img_mod` is [2 B, 6 D] (the
// timestep's, then timestep 0's) and `conditioning_tokens` [1, S_img, 1] bool
// says which image tokens take the second set (the images after the first
// of each sample), else it is undefined. `key_mask`: [B, S_txt + S_img] bool
// or undefined.
void qwen_block_forward(const QwenBlockWeights& w, const QwenImageConfig& config, const at::Tensor& img_mod,
                        const at::Tensor& txt_mod, const at::Tensor& conditioning_tokens, const nn::Rope& rope,
                        const at::Tensor& key_mask, at::Tensor& hidden, at::Tensor& encoder,
                        int64_t attention_chunk);

}  // namespace tprun::models
