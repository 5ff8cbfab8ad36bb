// The double-stream and single-stream blocks of Flux2Transformer2DModel, per
// TP rank (see flux2_transformer.h for the communication plan).
#include "models/flux2_blocks.h"

#include <utility>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <fmt/format.h>

namespace tprun::models {
namespace {

// Flux2SwiGLU: silu(first half) * second half of the last dim. Under packed
// colwise sharding this rank's halves are its gate and up slices.
at::Tensor swiglu(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return nn::silu(x.narrow(-1, 0, half)) * x.narrow(-1, half, x.size(-1) - half);
}

// No layer of the model has a bias.

}  // namespace

Flux2Weights declare_flux2(const Flux2Config& c, bool shard_modulation, ModelBuilder& b) {
  using checkpoint::ShardStyle;
  const int64_t inner = c.inner();
  const int64_t mlp = c.mlp_hidden();
  const LinearDecl plain = LinearDecl::replicated();
  const LinearDecl col = LinearDecl::colwise();
  const LinearDecl row = LinearDecl::rowwise();
  const LinearDecl ff_in = LinearDecl::packed_colwise({mlp, mlp});  // diffusers' PackedColwiseParallel([1, 1])
  const LinearDecl modulation =
      LinearDecl::of(shard_modulation ? ShardStyle::RowwiseSplitInput : ShardStyle::Replicated);
  b.tp_divides("num_attention_heads", c.heads);

  Flux2Weights w;
  w.timestep_embedder =
      mmdit::declare_mlp_embedder(b, "time_guidance_embed.timestep_embedder.", inner, c.timestep_channels, plain);
  w.has_guidance = c.guidance;
  if (c.guidance) {
    w.guidance_embedder =
        mmdit::declare_mlp_embedder(b, "time_guidance_embed.guidance_embedder.", inner, c.timestep_channels, plain);
  }
  w.mod_img = b.linear("double_stream_modulation_img.linear", 6 * inner, inner, modulation);
  w.mod_txt = b.linear("double_stream_modulation_txt.linear", 6 * inner, inner, modulation);
  w.mod_single = b.linear("single_stream_modulation.linear", 3 * inner, inner, modulation);
  w.x_embedder = b.linear("x_embedder", inner, c.in_channels, plain);
  w.context_embedder = b.linear("context_embedder", inner, c.joint_dim, plain);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    Flux2DoubleBlockWeights d;
    mmdit::JointAttentionWeights& a = d.attn;
    a.to_q = b.linear(p + "attn.to_q", inner, inner, col);
    a.to_k = b.linear(p + "attn.to_k", inner, inner, col);
    a.to_v = b.linear(p + "attn.to_v", inner, inner, col);
    a.norm_q = b.tensor(p + "attn.norm_q.weight", {c.head_dim}, TensorKind::Norm);
    a.norm_k = b.tensor(p + "attn.norm_k.weight", {c.head_dim}, TensorKind::Norm);
    a.to_out = b.linear(p + "attn.to_out.0", inner, inner, row);
    a.norm_added_q = b.tensor(p + "attn.norm_added_q.weight", {c.head_dim}, TensorKind::Norm);
    a.norm_added_k = b.tensor(p + "attn.norm_added_k.weight", {c.head_dim}, TensorKind::Norm);
    a.add_q = b.linear(p + "attn.add_q_proj", inner, inner, col);
    a.add_k = b.linear(p + "attn.add_k_proj", inner, inner, col);
    a.add_v = b.linear(p + "attn.add_v_proj", inner, inner, col);
    a.to_add_out = b.linear(p + "attn.to_add_out", inner, inner, row);
    d.ff_in = b.linear(p + "ff.linear_in", 2 * mlp, inner, ff_in);
    d.ff_out = b.linear(p + "ff.linear_out", inner, mlp, row);
    d.ff_context_in = b.linear(p + "ff_context.linear_in", 2 * mlp, inner, ff_in);
    d.ff_context_out = b.linear(p + "ff_context.linear_out", inner, mlp, row);
    w.doubles.push_back(std::move(d));
  }
  for (int64_t i = 0; i < c.single_layers; ++i) {
    const std::string p = fmt::format("single_transformer_blocks.{}.", i);
    Flux2SingleBlockWeights s;
    // Flux2ParallelSelfAttention's _tp_packed_col_blocks / _tp_packed_row_blocks.
    s.to_qkv_mlp = b.linear(p + "attn.to_qkv_mlp_proj", 3 * inner + 2 * mlp, inner,
                            LinearDecl::packed_colwise({inner, inner, inner, mlp, mlp}));
    s.norm_q = b.tensor(p + "attn.norm_q.weight", {c.head_dim}, TensorKind::Norm);
    s.norm_k = b.tensor(p + "attn.norm_k.weight", {c.head_dim}, TensorKind::Norm);
    s.to_out = b.linear(p + "attn.to_out", inner, inner + mlp, LinearDecl::packed_rowwise({inner, mlp}));
    w.singles.push_back(std::move(s));
  }
  w.norm_out = b.linear("norm_out.linear", 2 * inner, inner, plain);
  w.proj_out = b.linear("proj_out", c.patch * c.patch * c.out_channels, inner, plain);
  return w;
}

void flux2_double_block_forward(const Flux2DoubleBlockWeights& w, const Flux2Config& c, const at::Tensor& mod_img,
                                const at::Tensor& mod_txt, const nn::Rope& rope, at::Tensor& hidden,
                                at::Tensor& encoder, int64_t attention_chunk) {
  // Flux2Modulation.split(mod, 2): (shift, scale, gate) for attention, then for the feed-forward.
  auto m = mod_img.chunk(6, 1);
  auto mc = mod_txt.chunk(6, 1);
  const at::Tensor nx = mmdit::modulate(hidden, m[0], m[1], c.eps);
  const at::Tensor nc = mmdit::modulate(encoder, mc[0], mc[1], c.eps);

  // Joint attention over [text, image]; one AllReduce closes both streams' output projections.
  mmdit::StreamPair out = mmdit::joint_attention(w.attn, c.head_dim, c.eps, nx, nc, rope, attention_chunk);
  hidden = mmdit::add_gated(hidden, m[2], out.image);
  encoder = mmdit::add_gated(encoder, mc[2], out.text);

  // SwiGLU feed-forwards, one AllReduce for both streams.
  const at::Tensor fx = swiglu(w.ff_in.forward(mmdit::modulate(hidden, m[3], m[4], c.eps)));
  const at::Tensor fc = swiglu(w.ff_context_in.forward(mmdit::modulate(encoder, mc[3], mc[4], c.eps)));
  out = mmdit::rowwise_pair(w.ff_out, fx, w.ff_context_out, fc);
  hidden = mmdit::add_gated(hidden, m[5], out.image);
  encoder = mmdit::clip_fp16(mmdit::add_gated(encoder, mc[5], out.text));
}

void flux2_single_block_forward(const Flux2SingleBlockWeights& w, const Flux2Config& c, const at::Tensor& mod,
                                const nn::Rope& rope, at::Tensor& joint, int64_t attention_chunk) {
  auto m = mod.chunk(3, 1);  // shift, scale, gate
  const at::Tensor proj = w.to_qkv_mlp.forward(mmdit::modulate(joint, m[0], m[1], c.eps));
  // Split this rank's [q_r, k_r, v_r, gate_r, up_r] by the global QKV : MLP
  // ratio (packed sharding keeps it on every rank).
  const int64_t qkv_dim = 3 * c.inner(), mlp_dim = 2 * c.mlp_hidden();
  const int64_t local_qkv = proj.size(-1) * qkv_dim / (qkv_dim + mlp_dim);
  auto qkv = proj.narrow(-1, 0, local_qkv).chunk(3, -1);
  const at::Tensor mlp = swiglu(proj.narrow(-1, local_qkv, proj.size(-1) - local_qkv));

  const int64_t hd = c.head_dim;
  const at::Tensor q = mmdit::split_heads(qkv[0], hd, &w.norm_q, c.eps);
  const at::Tensor k = mmdit::split_heads(qkv[1], hd, &w.norm_k, c.eps);
  const at::Tensor v = mmdit::split_heads(qkv[2], hd, nullptr, c.eps);
  const at::Tensor attn = mmdit::rope_attention(q, k, v, rope, w.to_qkv_mlp.tp().size, attention_chunk);
  // to_out is packed rowwise over [attn (inner), mlp (mlp_hidden)]: this
  // rank's input is its attention heads followed by its mlp slice.
  joint = mmdit::clip_fp16(mmdit::add_gated(joint, m[2], w.to_out.forward(at::cat({attn, mlp}, -1))));
}

}  // namespace tprun::models
