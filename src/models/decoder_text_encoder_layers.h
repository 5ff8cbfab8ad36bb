#pragma once
// The computing pieces of the decoder-only text encoders
// (models/decoder_text_encoder.h has the model, its plan and its numerics):
// transformers' RMSNorm, rotary tables, the attention mask and one
// decoder layer under tensor parallelism, each written as transformers 5.17
// computes it so that fp32 and bf16 runs match op for op.

#include <cstdint>
#include <string>
#include <utility>

#include "parallel/parallel_linear.h"
#include "parallel/weight.h"

namespace at {
class Tensor;
}

namespace tprun::models {

struct RopeParams;

// Qwen3RMSNorm / MistralRMSNorm: weight * (x_fp32 * rsqrt(mean(x_fp32^2, -1) + eps)).to(x.dtype),
// the product in the weight's (compute) dtype.
at::Tensor decoder_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The rotary embedding class's inv_freq [head_dim / 2] (fp32, CPU) and
// attention_scaling for `rope` (transformers' ROPE_INIT_FUNCTIONS: default,
// linear, llama3, yarn), op for op.
std::pair<at::Tensor, double> rope_inverse_frequencies(const RopeParams& rope, int64_t head_dim,
                                                       int64_t max_position_embeddings);

// cos, sin [1, 1, S, head_dim] for positions 0..S-1: freqs = inv_freq x pos
// in fp32, emb = cat(freqs, freqs), cos(emb) * scaling, cast to `like`'s
// dtype and device.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, double attention_scaling, int64_t seq,
                                               const at::Tensor& like);

// q * cos + rotate_half(q) * sin on [B, H, S, D], rotate_half(x) = cat(-x2, x1).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// sdpa_mask: [B, 1, S, S] bool, true where key j is visible to query i
// (j <= i, keep[b, j], and j > i - window when window > 0). keep: [B, S].
at::Tensor attention_visibility(const at::Tensor& keep, int64_t window);

struct DecoderLayerWeights {
  parallel::Weight input_norm, post_norm;
  parallel::Weight q_norm, k_norm;  // [head_dim], Qwen3 only
  parallel::ParallelLinear q, k, v, o;
  parallel::ParallelLinear gate, up, down;
};

// What one layer needs besides its weights.
struct DecoderLayerContext {
  int64_t head_dim = 0;
  int64_t groups = 1;  // num_attention_heads / num_key_value_heads
  double eps = 1e-6;
  std::string act = "silu";
  const at::Tensor* cos = nullptr;  // [1, 1, S, D]
  const at::Tensor* sin = nullptr;
  const at::Tensor* mask = nullptr;  // [B, 1, S, S] additive
  int64_t attention_chunk = 0;       // MemoryOptions::attention_chunk (nn::sdpa; 0 = one call)
};

// One decoder layer on [B, S, hidden] with this rank's heads: self-attention
// (o_proj reduces: 1 AllReduce) then the SwiGLU MLP (down_proj: 1 AllReduce),
// each added to the residual. `attention_out`, when given, receives o_proj's output.
at::Tensor decoder_layer_forward(const DecoderLayerWeights& w, const at::Tensor& hidden,
                                 const DecoderLayerContext& ctx, at::Tensor* attention_out = nullptr);

}  // namespace tprun::models
