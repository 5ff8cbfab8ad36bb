#pragma once
// The pieces of an MMDiT (a diffusion transformer with an image and a text
// stream) that FLUX.1, FLUX.2 and Qwen-Image share,
// per TP rank: AdaLN modulation, heads with their QK RMSNorm, joint attention
// over the concatenated [text, image] tokens with RoPE, the one AllReduce that
// closes both streams' row-wise projections, the two-linear embedders and
// AdaLayerNormContinuous. Each family keeps its own block weights, their
// declaration order (diffusers' module order) and its feed-forwards; these
// functions are what their forwards have in common. Internal to the model
// families, not a public API.

#include <cstdint>
#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "models/model_builder.h"
#include "models/nn_ops.h"
#include "parallel/parallel_linear.h"
#include "parallel/weight.h"

namespace tprun::models::mmdit {

// (1 + scale) * LayerNorm(x) + shift, LayerNorm without affine; shift and
// scale [B, D] broadcast over the tokens (AdaLayerNormZero, Flux2Modulation).
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);

// x + gate * y, gate [B, D] broadcast over the tokens (the gated residuals).
at::Tensor add_gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

// [B, S, h*D] -> [B, h, S, D], with the per-head RMSNorm when `norm` is given.
at::Tensor split_heads(const at::Tensor& y, int64_t head_dim, const parallel::Weight* norm, double eps);
// [B, h, S, D] -> [B, S, h*D].
at::Tensor merge_heads(const at::Tensor& heads);

// RoPE on q and k ([B, h, S, D], this rank's heads), attention, heads merged:
// [B, S, h*D]. `tp_share`: the TP group size the heads are split over
// (nn::attention); `attention_chunk`: MemoryOptions::attention_chunk.
at::Tensor rope_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const nn::Rope& rope,
                          int64_t tp_share, int64_t attention_chunk);

// fp16 activations clamped to the finite range, as diffusers does after a
// block's residual; other dtypes unchanged.
at::Tensor clip_fp16(const at::Tensor& x);

// One result per stream.
struct StreamPair {
  at::Tensor image, text;
};

// Both streams' row-wise projections (`image_out` over `image_in`, `text_out`
// over `text_in`) closed by one AllReduce; outputs reduced and biased.
StreamPair rowwise_pair(const parallel::ParallelLinear& image_out, const at::Tensor& image_in,
                        const parallel::ParallelLinear& text_out, const at::Tensor& text_in);

// A dual-stream block's attention (diffusers' attn of FluxTransformerBlock,
// Flux2TransformerBlock, QwenImageTransformerBlock): Q/K/V of each stream
// (colwise, this rank's heads), QK RMSNorm per head, output projections
// (rowwise). Each family declares these in its own module order.
struct JointAttentionWeights {
  parallel::ParallelLinear to_q, to_k, to_v;     // image stream
  parallel::Weight norm_q, norm_k;
  parallel::ParallelLinear add_q, add_k, add_v;  // text stream (add_*_proj)
  parallel::Weight norm_added_q, norm_added_k;
  parallel::ParallelLinear to_out, to_add_out;   // to_out.0 (image), to_add_out (text)
};

// Joint attention over the concatenated [text, image] tokens of the
// modulated streams, RoPE over the same order, then each stream's output
// projection; one AllReduce for both. `eps`: the QK RMSNorm's.
StreamPair joint_attention(const JointAttentionWeights& w, int64_t head_dim, double eps, const at::Tensor& image,
                           const at::Tensor& text, const nn::Rope& rope, int64_t attention_chunk);

// The variations of joint attention a family may need (defaults: FLUX's).
enum class QkNorm {
  Torch,      // torch.nn.RMSNorm (nn::rms_norm): FLUX.1 / FLUX.2 attention
  Diffusers,  // diffusers' RMSNorm (nn::diffusers_rms_norm): the shared Attention class (Qwen-Image)
};
struct JointAttentionOptions {
  QkNorm qk_norm = QkNorm::Torch;
  // A boolean mask over the keys [B, S_txt + S_img] in [text, image] order
  // (true = attend; padded text tokens false), or undefined for none. Every
  // query sees the same keys (SDPA attn_mask [B, 1, 1, S]).
  at::Tensor key_mask;
};
// joint_attention with options; with the defaults it is the call above.
StreamPair joint_attention(const JointAttentionWeights& w, int64_t head_dim, double eps, const at::Tensor& image,
                           const at::Tensor& text, const nn::Rope& rope, int64_t attention_chunk,
                           const JointAttentionOptions& options);

// linear_2(silu(linear_1(x))): diffusers' TimestepEmbedding and the
// PixArtAlphaTextProjection (act_fn "silu") the families use for the
// timestep, guidance and pooled-text embeddings.
struct MlpEmbedder {
  parallel::ParallelLinear linear_1, linear_2;
  at::Tensor forward(const at::Tensor& x) const;
};
// Declares `prefix`linear_1 [out, in] and `prefix`linear_2 [out, out].
MlpEmbedder declare_mlp_embedder(ModelBuilder& b, const std::string& prefix, int64_t out, int64_t in,
                                 const LinearDecl& decl);

// Casts a tensor to the weights' compute dtype and device.
using ToCompute = std::function<at::Tensor(const at::Tensor&)>;

// A timestep or guidance value [B] through Timesteps(channels,
// flip_sin_to_cos, shift 0) and `embedder`: cast to the compute dtype,
// * 1000, sinusoidal features cast again, then the two linears.
at::Tensor embed_timestep(const MlpEmbedder& embedder, const at::Tensor& t, int64_t channels,
                          const ToCompute& to_compute);

// AdaLayerNormContinuous (norm_out): (scale, shift) = chunk(linear(act), 2),
// then (1 + scale) * LayerNorm(x) + shift. `act`: silu(temb).
at::Tensor ada_norm_continuous(const parallel::ParallelLinear& linear, const at::Tensor& act, const at::Tensor& x,
                               double eps);

}  // namespace tprun::models::mmdit
