// The computing pieces of the decoder-only text encoders, op for op as
// transformers 5.17 writes them (modeling_qwen3.py / modeling_mistral.py /
// modeling_qwen2_5_vl.py's text model, modeling_rope_utils.py,
// masking_utils.sdpa_mask, sdpa_attention_forward).
// Python's `scalar / tensor` is tensor.reciprocal() * scalar and `scalar - tensor`
// is rsub; both are kept so that the fp32 RoPE tables are bitwise the same.
#include "models/decoder_text_encoder_layers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/where.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include "models/decoder_text_encoder.h"
#include "models/nn_ops.h"
#include "models/text_encoder_common.h"
#include "runtime/error.h"

namespace tprun::models {

at::Tensor decoder_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor variance = xf.pow(2).mean({-1}, /*keepdim=*/true);
  const at::Tensor y = xf * at::rsqrt(variance + eps);
  return weight * y.to(x.scalar_type());
}

namespace {

const auto kF32 = at::TensorOptions().dtype(at::kFloat);

// base ** (arange(0, dim, 2) / dim) in fp32 (every rope type starts from it).
at::Tensor rope_base_powers(double base, int64_t dim) {
  return at::pow(base, at::arange(0, dim, 2, kF32) / dim);
}

// _compute_yarn_parameters.get_mscale
double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

std::pair<at::Tensor, double> yarn(const RopeParams& r, int64_t dim, int64_t max_position_embeddings) {
  const double base = r.theta;
  const double original = static_cast<double>(r.original_max_position_embeddings);
  const double factor = r.factor ? *r.factor : static_cast<double>(max_position_embeddings) / original;
  double attention_factor;
  if (r.attention_factor) {
    attention_factor = *r.attention_factor;
  } else if (r.mscale.value_or(0.0) != 0.0 && r.mscale_all_dim.value_or(0.0) != 0.0) {
    attention_factor = yarn_mscale(factor, *r.mscale) / yarn_mscale(factor, *r.mscale_all_dim);
  } else {
    attention_factor = yarn_mscale(factor, 1.0);
  }
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor's guard

  const at::Tensor pos_freqs = rope_base_powers(base, dim);
  const at::Tensor extrapolation = at::reciprocal(pos_freqs);
  const at::Tensor interpolation = at::reciprocal(pos_freqs * factor);
  const at::Tensor ramp = at::clamp((at::arange(dim / 2, kF32) - low) / (high - low), 0, 1);
  const at::Tensor extrapolation_factor = at::rsub(ramp, 1);
  const at::Tensor inv_freq =
      interpolation * at::rsub(extrapolation_factor, 1) + extrapolation * extrapolation_factor;
  return {inv_freq, attention_factor};
}

at::Tensor llama3(const RopeParams& r, int64_t dim) {
  const double factor = *r.factor;
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_wavelen = old_context / r.low_freq_factor;
  const double high_wavelen = old_context / r.high_freq_factor;
  const at::Tensor inv_freq = at::reciprocal(rope_base_powers(r.theta, dim));
  const at::Tensor wavelen = at::reciprocal(inv_freq) * (2 * M_PI);
  at::Tensor llama = at::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
  const at::Tensor smooth =
      (at::reciprocal(wavelen) * old_context - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = at::rsub(smooth, 1) * llama / factor + smooth * llama;
  const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, llama);
}

}  // namespace

std::pair<at::Tensor, double> rope_inverse_frequencies(const RopeParams& r, int64_t head_dim,
                                                       int64_t max_position_embeddings) {
  if (r.type == "default") return {at::reciprocal(rope_base_powers(r.theta, head_dim)), 1.0};
  if (r.type == "linear") return {at::reciprocal(rope_base_powers(r.theta, head_dim)) / *r.factor, 1.0};
  if (r.type == "llama3") return {llama3(r, head_dim), 1.0};
  if (r.type == "yarn") return yarn(r, head_dim, max_position_embeddings);
  throw Error(Error::Kind::Internal, fmt::format("rope_type '{}' reached the rotary tables", r.type));
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, double attention_scaling, int64_t seq,
                                               const at::Tensor& like) {
  const auto f32 = kF32.device(like.device());
  // inv_freq[None, :, None] @ position_ids[:, None, :], transposed: [1, S, D/2].
  const at::Tensor inv = inv_freq.to(f32).view({1, -1, 1});
  const at::Tensor positions = at::arange(seq, f32).view({1, 1, seq});
  const at::Tensor freqs = at::matmul(inv, positions).transpose(1, 2);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  at::Tensor cos = at::cos(emb) * attention_scaling;
  at::Tensor sin = at::sin(emb) * attention_scaling;
  return {cos.to(like.scalar_type()).unsqueeze(1), sin.to(like.scalar_type()).unsqueeze(1)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return (x * cos) + (rotated * sin);
}


at::Tensor attention_visibility(const at::Tensor& keep, int64_t window) {
  const int64_t seq = keep.size(1);
  const at::Tensor idx = at::arange(seq, at::TensorOptions().dtype(at::kLong).device(keep.device()));
  const at::Tensor q = idx.view({seq, 1}), kv = idx.view({1, seq});
  at::Tensor visible = kv <= q;                                   // causal_mask_function
  if (window > 0) visible = visible.logical_and(kv > q - window);  // sliding_window_overlay
  return visible.unsqueeze(0).logical_and(keep.to(at::kBool).unsqueeze(1)).unsqueeze(1);  // padding_mask_function
}

at::Tensor decoder_layer_forward(const DecoderLayerWeights& w, const at::Tensor& hidden,
                                 const DecoderLayerContext& ctx, at::Tensor* attention_out) {
  const int64_t batch = hidden.size(0), seq = hidden.size(1), d = ctx.head_dim;
  // Self-attention on this rank's heads.
  at::Tensor x = decoder_rms_norm(hidden, w.input_norm.get(), ctx.eps);
  at::Tensor q = w.q.forward(x).view({batch, seq, -1, d});
  at::Tensor k = w.k.forward(x).view({batch, seq, -1, d});
  if (w.q_norm.defined()) {
    q = decoder_rms_norm(q, w.q_norm.get(), ctx.eps);
    k = decoder_rms_norm(k, w.k_norm.get(), ctx.eps);
  }
  q = apply_rotary(q.transpose(1, 2), *ctx.cos, *ctx.sin);
  k = apply_rotary(k.transpose(1, 2), *ctx.cos, *ctx.sin);
  at::Tensor v = w.v.forward(x).view({batch, seq, -1, d}).transpose(1, 2);
  if (ctx.groups > 1) {  // repeat_kv: local q head i reads local kv head i / groups
    const int64_t kv_heads = k.size(1);
    k = k.unsqueeze(2).expand({batch, kv_heads, ctx.groups, seq, d}).reshape({batch, kv_heads * ctx.groups, seq, d});
    v = v.unsqueeze(2).expand({batch, kv_heads, ctx.groups, seq, d}).reshape({batch, kv_heads * ctx.groups, seq, d});
  }
  // transformers' default attention (sdpa) with its boolean mask: the same
  // libtorch kernel diffusers' pipelines run; a query that sees no key (left
  // padding) gets 0, as torch's SDPA gives it. With attention_chunk the
  // queries (and the mask's query rows) go in chunks.
  const double scaling = std::pow(static_cast<double>(d), -0.5);
  const at::Tensor attn = nn::sdpa(q, k, v, *ctx.mask, scaling, ctx.attention_chunk)
                              .transpose(1, 2)
                              .contiguous()
                              .reshape({batch, seq, -1});
  const at::Tensor attn_out = w.o.forward(attn);  // rowwise: reduced, biased
  if (attention_out) *attention_out = attn_out;
  at::Tensor h = hidden + attn_out;
  // SwiGLU MLP on this rank's intermediate slice.
  x = decoder_rms_norm(h, w.post_norm.get(), ctx.eps);
  const at::Tensor inner = hf_activation(w.gate.forward(x), ctx.act) * w.up.forward(x);
  return h + w.down.forward(inner);
}

}  // namespace tprun::models
