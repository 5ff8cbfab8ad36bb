// The declarations, the across-heads RMSNorm and the block of
// WanTransformer3DModel, per TP rank (see wan_blocks.h for the math,
// wan_transformer.h for the communication plan).
#include "models/wan_blocks.h"

#include <utility>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/sum.h>
#include <fmt/format.h>

namespace tprun::models {
namespace {

using checkpoint::ShardStyle;

WanAttentionWeights declare_attention(ModelBuilder& b, const std::string& p, int64_t inner) {
  const LinearDecl col = LinearDecl::colwise().with_bias();
  WanAttentionWeights a;
  a.to_q = b.linear(p + "to_q", inner, inner, col);
  a.to_k = b.linear(p + "to_k", inner, inner, col);
  a.to_v = b.linear(p + "to_v", inner, inner, col);
  a.to_out = b.linear(p + "to_out.0", inner, inner, LinearDecl::rowwise().with_bias());
  a.norm_q = b.tensor(p + "norm_q.weight", {inner}, TensorKind::Norm, ShardStyle::Colwise);
  a.norm_k = b.tensor(p + "norm_k.weight", {inner}, TensorKind::Norm, ShardStyle::Colwise);
  return a;
}

// [B, S, n] (this rank's heads) -> [B, heads, S, head_dim].
at::Tensor split_heads(const at::Tensor& x, int64_t head_dim) {
  return x.view({x.size(0), x.size(1), -1, head_dim}).transpose(1, 2);
}

// WanAttention over this rank's heads: `kv` is x itself for self-attention;
// `rope` is null for the cross-attention.
at::Tensor attention(const WanAttentionWeights& a, const WanTransformerConfig& c, const at::Tensor& x,
                     const at::Tensor& kv, const nn::Rope* rope, int64_t chunk) {
  const parallel::TpContext& tp = a.to_q.tp();
  auto [q, k] = rms_norm_across_heads(a.to_q.forward(x), a.norm_q.get(), a.to_k.forward(kv), a.norm_k.get(),
                                      c.inner(), c.eps, tp);
  q = split_heads(q, c.head_dim);
  k = split_heads(k, c.head_dim);
  const at::Tensor v = split_heads(a.to_v.forward(kv), c.head_dim);
  if (rope) {
    q = nn::apply_rope(q, *rope);
    k = nn::apply_rope(k, *rope);
  }
  const at::Tensor o = nn::attention(q, k, v, tp.size, chunk);  // [B, h, S, head_dim]
  return a.to_out.forward(o.transpose(1, 2).reshape({x.size(0), x.size(1), -1}));
}

// FP32LayerNorm without affine of x in fp32, modulated: LN(x) * (1 + scale) + shift.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  return nn::layer_norm(x.to(at::kFloat), eps) * (1 + scale) + shift;
}

}  // namespace

WanWeights declare_wan(const WanTransformerConfig& c, bool shard_modulation, ModelBuilder& b) {
  const int64_t inner = c.inner();
  const LinearDecl plain = LinearDecl::replicated().with_bias();
  const LinearDecl fp32 = plain.in_dtype("fp32");
  b.tp_divides("num_attention_heads", c.heads);
  b.tp_divides("ffn_dim", c.ffn_dim);

  WanWeights w;
  w.scale_shift_table = b.tensor("scale_shift_table", {1, 2, inner}, TensorKind::Norm, ShardStyle::Replicated, "fp32");
  w.patch_weight = b.tensor("patch_embedding.weight",
                            {inner, c.in_channels, c.patch_size[0], c.patch_size[1], c.patch_size[2]},
                            TensorKind::Conv);
  w.patch_bias = b.tensor("patch_embedding.bias", {inner}, TensorKind::Bias);
  const std::string ce = "condition_embedder.";
  w.time_1 = b.linear(ce + "time_embedder.linear_1", inner, c.freq_dim, fp32);
  w.time_2 = b.linear(ce + "time_embedder.linear_2", inner, inner, fp32);
  w.time_proj = b.linear(ce + "time_proj", 6 * inner, inner,
                         shard_modulation ? LinearDecl::rowwise_split_input().with_bias() : plain);
  w.text_1 = b.linear(ce + "text_embedder.linear_1", inner, c.text_dim, plain);
  w.text_2 = b.linear(ce + "text_embedder.linear_2", inner, inner, plain);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("blocks.{}.", i);
    WanBlockWeights blk;
    blk.scale_shift_table =
        b.tensor(p + "scale_shift_table", {1, 6, inner}, TensorKind::Norm, ShardStyle::Replicated, "fp32");
    blk.attn1 = declare_attention(b, p + "attn1.", inner);
    blk.attn2 = declare_attention(b, p + "attn2.", inner);
    if (c.cross_attn_norm) {
      blk.norm2.weight = b.tensor(p + "norm2.weight", {inner}, TensorKind::Norm, ShardStyle::Replicated, "fp32");
      blk.norm2.bias = b.tensor(p + "norm2.bias", {inner}, TensorKind::Bias, ShardStyle::Replicated, "fp32");
    }
    blk.ffn_in = b.linear(p + "ffn.net.0.proj", c.ffn_dim, inner, LinearDecl::colwise().with_bias());
    blk.ffn_out = b.linear(p + "ffn.net.2", inner, c.ffn_dim, LinearDecl::rowwise().with_bias());
    w.blocks.push_back(std::move(blk));
  }
  w.proj_out = b.linear("proj_out", c.out_channels * c.patch_volume(), inner, plain);
  return w;
}

std::pair<at::Tensor, at::Tensor> rms_norm_across_heads(const at::Tensor& x, const at::Tensor& x_weight,
                                                        const at::Tensor& y, const at::Tensor& y_weight,
                                                        int64_t full, double eps, const parallel::TpContext& tp) {
  const at::Tensor xf = x.to(at::kFloat), yf = y.to(at::kFloat);
  const std::vector<at::Tensor> sums =
      parallel::all_reduce_coalesced(tp, {xf.pow(2).sum(-1, true), yf.pow(2).sum(-1, true)});
  const double n = static_cast<double>(full);
  auto norm = [&](const at::Tensor& t, const at::Tensor& sum, const at::Tensor& weight, c10::ScalarType dtype) {
    return (t * at::rsqrt(sum / n + eps) * weight.to(at::kFloat)).to(dtype);
  };
  return {norm(xf, sums[0], x_weight, x.scalar_type()), norm(yf, sums[1], y_weight, y.scalar_type())};
}

void wan_block_forward(const WanBlockWeights& w, const WanTransformerConfig& c, const at::Tensor& mod,
                       const at::Tensor& text, const nn::Rope& rope, at::Tensor& hidden, int64_t attention_chunk) {
  const c10::ScalarType dtype = hidden.scalar_type();
  // (shift, scale, gate, c_shift, c_scale, c_gate), each [B, 1, D] fp32.
  const std::vector<at::Tensor> m = (w.scale_shift_table.get() + mod).chunk(6, 1);

  // 1. Self-attention with RoPE; the gated residual in fp32.
  const at::Tensor n1 = modulate(hidden, m[0], m[1], c.eps).to(dtype);
  const at::Tensor a1 = attention(w.attn1, c, n1, n1, &rope, attention_chunk);
  hidden = (hidden.to(at::kFloat) + a1 * m[2]).to(dtype);

  // 2. Cross-attention to the text (norm2: FP32LayerNorm with affine, or identity).
  const at::Tensor n2 =
      c.cross_attn_norm ? at::layer_norm(hidden.to(at::kFloat), {hidden.size(-1)}, w.norm2.weight.get(),
                                         w.norm2.bias.get(), c.eps)
                              .to(dtype)
                        : hidden;
  hidden = hidden + attention(w.attn2, c, n2, text, nullptr, attention_chunk);

  // 3. Feed-forward (GELU tanh); the gated residual in fp32.
  const at::Tensor n3 = modulate(hidden, m[3], m[4], c.eps).to(dtype);
  const at::Tensor ff = w.ffn_out.forward(nn::gelu_tanh(w.ffn_in.forward(n3)));
  hidden = (hidden.to(at::kFloat) + ff.to(at::kFloat) * m[5]).to(dtype);
}

}  // namespace tprun::models
