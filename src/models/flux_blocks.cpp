// The double-stream and single-stream blocks of FluxTransformer2DModel, per
// TP rank (see flux_transformer.h for the communication plan).
#include "models/flux_blocks.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::models {
namespace {

// LayerNorm (no affine, eps 1e-6) then x * (1 + scale) + shift, [B, D] broadcast over tokens.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return nn::layer_norm(x, 1e-6) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

// [B, S, h*D] -> [B, h, S, D], with the per-head RMSNorm when given.
at::Tensor heads_of(const at::Tensor& y, int64_t head_dim, const parallel::Weight* norm) {
  at::Tensor t = y.unflatten(-1, {-1, head_dim});
  if (norm) t = nn::rms_norm(t, norm->get(), 1e-6);
  return t.transpose(1, 2);
}

// [B, h, S, D] -> [B, S, h*D]
at::Tensor merge_heads(const at::Tensor& t) { return t.transpose(1, 2).flatten(2); }

at::Tensor clip_fp16(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? at::clamp(x, -65504, 65504) : x;
}

}  // namespace

FluxWeights declare_flux(const FluxConfig& c, bool shard_modulation, ModelBuilder& b) {
  using checkpoint::ShardStyle;
  const int64_t inner = c.inner();
  const int64_t ff = 4 * inner;   // FeedForward inner dim (mult 4)
  const int64_t mlp = 4 * inner;  // single block mlp_hidden_dim (mlp_ratio 4.0)
  const LinearDecl plain = LinearDecl::replicated().with_bias();
  const LinearDecl col = LinearDecl::colwise().with_bias();
  const LinearDecl row = LinearDecl::rowwise().with_bias();
  const LinearDecl modulation =
      LinearDecl::of(shard_modulation ? ShardStyle::RowwiseSplitInput : ShardStyle::Replicated).with_bias();
  b.tp_divides("num_attention_heads", c.heads);

  FluxWeights w;
  w.x_embedder = b.linear("x_embedder", inner, c.in_channels, plain);  // in_channels already counts packed patches
  w.context_embedder = b.linear("context_embedder", inner, c.joint_dim, plain);
  w.t_lin1 = b.linear("time_text_embed.timestep_embedder.linear_1", inner, 256, plain);
  w.t_lin2 = b.linear("time_text_embed.timestep_embedder.linear_2", inner, inner, plain);
  w.has_guidance = c.guidance;
  if (c.guidance) {
    w.g_lin1 = b.linear("time_text_embed.guidance_embedder.linear_1", inner, 256, plain);
    w.g_lin2 = b.linear("time_text_embed.guidance_embedder.linear_2", inner, inner, plain);
  }
  w.p_lin1 = b.linear("time_text_embed.text_embedder.linear_1", inner, c.pooled_dim, plain);
  w.p_lin2 = b.linear("time_text_embed.text_embedder.linear_2", inner, inner, plain);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    DoubleBlockWeights d;
    d.norm1 = b.linear(p + "norm1.linear", 6 * inner, inner, modulation);
    d.norm1_context = b.linear(p + "norm1_context.linear", 6 * inner, inner, modulation);
    d.norm_q = b.tensor(p + "attn.norm_q.weight", {c.head_dim}, TensorKind::Norm);
    d.norm_k = b.tensor(p + "attn.norm_k.weight", {c.head_dim}, TensorKind::Norm);
    d.norm_added_q = b.tensor(p + "attn.norm_added_q.weight", {c.head_dim}, TensorKind::Norm);
    d.norm_added_k = b.tensor(p + "attn.norm_added_k.weight", {c.head_dim}, TensorKind::Norm);
    d.to_q = b.linear(p + "attn.to_q", inner, inner, col);
    d.to_k = b.linear(p + "attn.to_k", inner, inner, col);
    d.to_v = b.linear(p + "attn.to_v", inner, inner, col);
    d.add_q = b.linear(p + "attn.add_q_proj", inner, inner, col);
    d.add_k = b.linear(p + "attn.add_k_proj", inner, inner, col);
    d.add_v = b.linear(p + "attn.add_v_proj", inner, inner, col);
    d.to_out = b.linear(p + "attn.to_out.0", inner, inner, row);
    d.to_add_out = b.linear(p + "attn.to_add_out", inner, inner, row);
    d.ff_in = b.linear(p + "ff.net.0.proj", ff, inner, col);
    d.ff_out = b.linear(p + "ff.net.2", inner, ff, row);
    d.ffc_in = b.linear(p + "ff_context.net.0.proj", ff, inner, col);
    d.ffc_out = b.linear(p + "ff_context.net.2", inner, ff, row);
    w.doubles.push_back(std::move(d));
  }
  for (int64_t i = 0; i < c.single_layers; ++i) {
    const std::string p = fmt::format("single_transformer_blocks.{}.", i);
    SingleBlockWeights s;
    s.norm = b.linear(p + "norm.linear", 3 * inner, inner, modulation);
    s.norm_q = b.tensor(p + "attn.norm_q.weight", {c.head_dim}, TensorKind::Norm);
    s.norm_k = b.tensor(p + "attn.norm_k.weight", {c.head_dim}, TensorKind::Norm);
    s.to_q = b.linear(p + "attn.to_q", inner, inner, col);
    s.to_k = b.linear(p + "attn.to_k", inner, inner, col);
    s.to_v = b.linear(p + "attn.to_v", inner, inner, col);
    s.proj_mlp = b.linear(p + "proj_mlp", mlp, inner, col);
    s.proj_out = b.linear(p + "proj_out", inner, inner + mlp, LinearDecl::packed_rowwise({inner, mlp}).with_bias());
    w.singles.push_back(std::move(s));
  }
  w.norm_out = b.linear("norm_out.linear", 2 * inner, inner, plain);
  w.proj_out = b.linear("proj_out", c.patch * c.patch * c.out_channels, inner, plain);
  return w;
}

void double_block_forward(const DoubleBlockWeights& w, int64_t head_dim, const at::Tensor& mod,
                          const at::Tensor& mod_context, const nn::Rope& rope, at::Tensor& hidden,
                          at::Tensor& encoder, int64_t attention_chunk) {
  // AdaLayerNormZero: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  auto m = mod.chunk(6, 1);
  auto mc = mod_context.chunk(6, 1);
  at::Tensor nx = modulate(hidden, m[0], m[1]);
  at::Tensor nc = modulate(encoder, mc[0], mc[1]);

  // Joint attention over [text, image], this rank's heads only.
  at::Tensor q = at::cat({heads_of(w.add_q.forward(nc), head_dim, &w.norm_added_q),
                          heads_of(w.to_q.forward(nx), head_dim, &w.norm_q)}, 2);
  at::Tensor k = at::cat({heads_of(w.add_k.forward(nc), head_dim, &w.norm_added_k),
                          heads_of(w.to_k.forward(nx), head_dim, &w.norm_k)}, 2);
  at::Tensor v = at::cat({heads_of(w.add_v.forward(nc), head_dim, nullptr),
                          heads_of(w.to_v.forward(nx), head_dim, nullptr)}, 2);
  q = nn::apply_rope(q, rope);
  k = nn::apply_rope(k, rope);
  at::Tensor attn = merge_heads(nn::attention(q, k, v, w.to_q.tp().size, attention_chunk));
  const int64_t txt = encoder.size(1);
  at::Tensor attn_txt = attn.narrow(1, 0, txt).contiguous();
  at::Tensor attn_img = attn.narrow(1, txt, attn.size(1) - txt).contiguous();

  // One AllReduce closes both streams' attention output projections.
  auto out = parallel::rowwise_forward(parallel::RowwiseBatch().add(w.to_out, attn_img).add(w.to_add_out, attn_txt));
  hidden = hidden + m[2].unsqueeze(1) * out[0];
  encoder = encoder + mc[2].unsqueeze(1) * out[1];

  // Feed-forwards (GELU-tanh), one AllReduce for both streams.
  const at::Tensor fx = nn::gelu_tanh(w.ff_in.forward(modulate(hidden, m[3], m[4])));
  const at::Tensor fc = nn::gelu_tanh(w.ffc_in.forward(modulate(encoder, mc[3], mc[4])));
  out = parallel::rowwise_forward(parallel::RowwiseBatch().add(w.ff_out, fx).add(w.ffc_out, fc));
  hidden = hidden + m[5].unsqueeze(1) * out[0];
  encoder = clip_fp16(encoder + mc[5].unsqueeze(1) * out[1]);
}

void single_block_forward(const SingleBlockWeights& w, int64_t head_dim, const at::Tensor& mod, const nn::Rope& rope,
                          at::Tensor& hidden, at::Tensor& encoder, int64_t attention_chunk) {
  const int64_t txt = encoder.size(1);
  at::Tensor x = at::cat({encoder, hidden}, 1);
  // AdaLayerNormZeroSingle: shift_msa, scale_msa, gate_msa.
  auto m = mod.chunk(3, 1);
  at::Tensor n = modulate(x, m[0], m[1]);
  at::Tensor mlp = nn::gelu_tanh(w.proj_mlp.forward(n));
  at::Tensor q = nn::apply_rope(heads_of(w.to_q.forward(n), head_dim, &w.norm_q), rope);
  at::Tensor k = nn::apply_rope(heads_of(w.to_k.forward(n), head_dim, &w.norm_k), rope);
  at::Tensor v = heads_of(w.to_v.forward(n), head_dim, nullptr);
  at::Tensor attn = merge_heads(nn::attention(q, k, v, w.to_q.tp().size, attention_chunk));
  // proj_out is packed rowwise over [attn (inner), mlp (mlp_hidden)]: this
  // rank's input is its attention heads followed by its mlp slice.
  x = clip_fp16(x + m[2].unsqueeze(1) * w.proj_out.forward(at::cat({attn, mlp}, 2)));
  encoder = x.narrow(1, 0, txt);
  hidden = x.narrow(1, txt, x.size(1) - txt);
}

}  // namespace tprun::models
