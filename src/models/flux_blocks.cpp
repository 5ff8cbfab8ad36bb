// The double-stream and single-stream blocks of FluxTransformer2DModel, per
// TP rank (see flux_transformer.h for the communication plan).
#include "models/flux_blocks.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <fmt/format.h>

namespace tprun::models {
namespace {

// FLUX.1's LayerNorm and QK RMSNorm epsilon.
constexpr double kEps = 1e-6;

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
  w.timestep_embedder = mmdit::declare_mlp_embedder(b, "time_text_embed.timestep_embedder.", inner, 256, plain);
  w.has_guidance = c.guidance;
  if (c.guidance) {
    w.guidance_embedder = mmdit::declare_mlp_embedder(b, "time_text_embed.guidance_embedder.", inner, 256, plain);
  }
  w.text_embedder = mmdit::declare_mlp_embedder(b, "time_text_embed.text_embedder.", inner, c.pooled_dim, plain);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    DoubleBlockWeights d;
    d.norm1 = b.linear(p + "norm1.linear", 6 * inner, inner, modulation);
    d.norm1_context = b.linear(p + "norm1_context.linear", 6 * inner, inner, modulation);
    mmdit::JointAttentionWeights& a = d.attn;
    a.norm_q = b.tensor(p + "attn.norm_q.weight", {c.head_dim}, TensorKind::Norm);
    a.norm_k = b.tensor(p + "attn.norm_k.weight", {c.head_dim}, TensorKind::Norm);
    a.norm_added_q = b.tensor(p + "attn.norm_added_q.weight", {c.head_dim}, TensorKind::Norm);
    a.norm_added_k = b.tensor(p + "attn.norm_added_k.weight", {c.head_dim}, TensorKind::Norm);
    a.to_q = b.linear(p + "attn.to_q", inner, inner, col);
    a.to_k = b.linear(p + "attn.to_k", inner, inner, col);
    a.to_v = b.linear(p + "attn.to_v", inner, inner, col);
    a.add_q = b.linear(p + "attn.add_q_proj", inner, inner, col);
    a.add_k = b.linear(p + "attn.add_k_proj", inner, inner, col);
    a.add_v = b.linear(p + "attn.add_v_proj", inner, inner, col);
    a.to_out = b.linear(p + "attn.to_out.0", inner, inner, row);
    a.to_add_out = b.linear(p + "attn.to_add_out", inner, inner, row);
    d.ff_in = b.linear(p + "ff.net.0.proj", ff, inner, col);
    d.ff_out = b.linear(p + "ff.net.2", inner, ff, row);
    d.ff_context_in = b.linear(p + "ff_context.net.0.proj", ff, inner, col);
    d.ff_context_out = b.linear(p + "ff_context.net.2", inner, ff, row);
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
  const at::Tensor nx = mmdit::modulate(hidden, m[0], m[1], kEps);
  const at::Tensor nc = mmdit::modulate(encoder, mc[0], mc[1], kEps);

  // Joint attention over [text, image]; one AllReduce closes both streams' output projections.
  mmdit::StreamPair out = mmdit::joint_attention(w.attn, head_dim, kEps, nx, nc, rope, attention_chunk);
  hidden = mmdit::add_gated(hidden, m[2], out.image);
  encoder = mmdit::add_gated(encoder, mc[2], out.text);

  // Feed-forwards (GELU-tanh), one AllReduce for both streams.
  const at::Tensor fx = nn::gelu_tanh(w.ff_in.forward(mmdit::modulate(hidden, m[3], m[4], kEps)));
  const at::Tensor fc = nn::gelu_tanh(w.ff_context_in.forward(mmdit::modulate(encoder, mc[3], mc[4], kEps)));
  out = mmdit::rowwise_pair(w.ff_out, fx, w.ff_context_out, fc);
  hidden = mmdit::add_gated(hidden, m[5], out.image);
  encoder = mmdit::clip_fp16(mmdit::add_gated(encoder, mc[5], out.text));
}

void single_block_forward(const SingleBlockWeights& w, int64_t head_dim, const at::Tensor& mod, const nn::Rope& rope,
                          at::Tensor& hidden, at::Tensor& encoder, int64_t attention_chunk) {
  const int64_t txt = encoder.size(1);
  at::Tensor x = at::cat({encoder, hidden}, 1);
  // AdaLayerNormZeroSingle: shift_msa, scale_msa, gate_msa.
  auto m = mod.chunk(3, 1);
  const at::Tensor n = mmdit::modulate(x, m[0], m[1], kEps);
  const at::Tensor mlp = nn::gelu_tanh(w.proj_mlp.forward(n));
  const at::Tensor q = mmdit::split_heads(w.to_q.forward(n), head_dim, &w.norm_q, kEps);
  const at::Tensor k = mmdit::split_heads(w.to_k.forward(n), head_dim, &w.norm_k, kEps);
  const at::Tensor v = mmdit::split_heads(w.to_v.forward(n), head_dim, nullptr, kEps);
  const at::Tensor attn = mmdit::rope_attention(q, k, v, rope, w.to_q.tp().size, attention_chunk);
  // proj_out is packed rowwise over [attn (inner), mlp (mlp_hidden)]: this
  // rank's input is its attention heads followed by its mlp slice.
  x = mmdit::clip_fp16(mmdit::add_gated(x, m[2], w.proj_out.forward(at::cat({attn, mlp}, 2))));
  encoder = x.narrow(1, 0, txt);
  hidden = x.narrow(1, txt, x.size(1) - txt);
}

}  // namespace tprun::models
