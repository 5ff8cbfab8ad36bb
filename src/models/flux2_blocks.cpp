// The double-stream and single-stream blocks of Flux2Transformer2DModel, per
// TP rank (see flux2_transformer.h for the communication plan).
#include "models/flux2_blocks.h"

#include <utility>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <fmt/format.h>

namespace tprun::models {
namespace {

// [B, S, h*D] -> [B, h, S, D], with the per-head RMSNorm when given.
at::Tensor heads_of(const at::Tensor& y, int64_t head_dim, const parallel::Weight* norm, double eps) {
  at::Tensor t = y.unflatten(-1, {-1, head_dim});
  if (norm) t = nn::rms_norm(t, norm->get(), eps);
  return t.transpose(1, 2);
}

// [B, h, S, D] -> [B, S, h*D]
at::Tensor merge_heads(const at::Tensor& t) { return t.transpose(1, 2).flatten(2); }

// Flux2SwiGLU: silu(first half) * second half of the last dim. Under packed
// colwise sharding this rank's halves are its gate and up slices.
at::Tensor swiglu(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return nn::silu(x.narrow(-1, 0, half)) * x.narrow(-1, half, x.size(-1) - half);
}

at::Tensor clip_fp16(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? at::clamp(x, -65504, 65504) : x;
}

// No layer of the model has a bias.

}  // namespace

at::Tensor flux2_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  return (1 + scale.unsqueeze(1)) * nn::layer_norm(x, eps) + shift.unsqueeze(1);
}

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
  w.t_lin1 = b.linear("time_guidance_embed.timestep_embedder.linear_1", inner, c.timestep_channels, plain);
  w.t_lin2 = b.linear("time_guidance_embed.timestep_embedder.linear_2", inner, inner, plain);
  w.has_guidance = c.guidance;
  if (c.guidance) {
    w.g_lin1 = b.linear("time_guidance_embed.guidance_embedder.linear_1", inner, c.timestep_channels, plain);
    w.g_lin2 = b.linear("time_guidance_embed.guidance_embedder.linear_2", inner, inner, plain);
  }
  w.mod_img = b.linear("double_stream_modulation_img.linear", 6 * inner, inner, modulation);
  w.mod_txt = b.linear("double_stream_modulation_txt.linear", 6 * inner, inner, modulation);
  w.mod_single = b.linear("single_stream_modulation.linear", 3 * inner, inner, modulation);
  w.x_embedder = b.linear("x_embedder", inner, c.in_channels, plain);
  w.context_embedder = b.linear("context_embedder", inner, c.joint_dim, plain);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    Flux2DoubleBlockWeights d;
    d.to_q = b.linear(p + "attn.to_q", inner, inner, col);
    d.to_k = b.linear(p + "attn.to_k", inner, inner, col);
    d.to_v = b.linear(p + "attn.to_v", inner, inner, col);
    d.norm_q = b.tensor(p + "attn.norm_q.weight", {c.head_dim}, TensorKind::Norm);
    d.norm_k = b.tensor(p + "attn.norm_k.weight", {c.head_dim}, TensorKind::Norm);
    d.to_out = b.linear(p + "attn.to_out.0", inner, inner, row);
    d.norm_added_q = b.tensor(p + "attn.norm_added_q.weight", {c.head_dim}, TensorKind::Norm);
    d.norm_added_k = b.tensor(p + "attn.norm_added_k.weight", {c.head_dim}, TensorKind::Norm);
    d.add_q = b.linear(p + "attn.add_q_proj", inner, inner, col);
    d.add_k = b.linear(p + "attn.add_k_proj", inner, inner, col);
    d.add_v = b.linear(p + "attn.add_v_proj", inner, inner, col);
    d.to_add_out = b.linear(p + "attn.to_add_out", inner, inner, row);
    d.ff_in = b.linear(p + "ff.linear_in", 2 * mlp, inner, ff_in);
    d.ff_out = b.linear(p + "ff.linear_out", inner, mlp, row);
    d.ffc_in = b.linear(p + "ff_context.linear_in", 2 * mlp, inner, ff_in);
    d.ffc_out = b.linear(p + "ff_context.linear_out", inner, mlp, row);
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
  const at::Tensor nx = flux2_modulate(hidden, m[0], m[1], c.eps);
  const at::Tensor nc = flux2_modulate(encoder, mc[0], mc[1], c.eps);

  // Joint attention over [text, image], this rank's heads only.
  const int64_t hd = c.head_dim;
  at::Tensor q = at::cat({heads_of(w.add_q.forward(nc), hd, &w.norm_added_q, c.eps),
                          heads_of(w.to_q.forward(nx), hd, &w.norm_q, c.eps)}, 2);
  at::Tensor k = at::cat({heads_of(w.add_k.forward(nc), hd, &w.norm_added_k, c.eps),
                          heads_of(w.to_k.forward(nx), hd, &w.norm_k, c.eps)}, 2);
  at::Tensor v = at::cat({heads_of(w.add_v.forward(nc), hd, nullptr, c.eps),
                          heads_of(w.to_v.forward(nx), hd, nullptr, c.eps)}, 2);
  q = nn::apply_rope(q, rope);
  k = nn::apply_rope(k, rope);
  at::Tensor attn = merge_heads(nn::attention(q, k, v, w.to_q.tp().size, attention_chunk));
  const int64_t txt = encoder.size(1);
  const at::Tensor attn_txt = attn.narrow(1, 0, txt).contiguous();
  const at::Tensor attn_img = attn.narrow(1, txt, attn.size(1) - txt).contiguous();

  // One AllReduce closes both streams' attention output projections.
  auto out = parallel::rowwise_forward(parallel::RowwiseBatch().add(w.to_out, attn_img).add(w.to_add_out, attn_txt));
  hidden = hidden + m[2].unsqueeze(1) * out[0];
  encoder = encoder + mc[2].unsqueeze(1) * out[1];

  // SwiGLU feed-forwards, one AllReduce for both streams.
  const at::Tensor fx = swiglu(w.ff_in.forward(flux2_modulate(hidden, m[3], m[4], c.eps)));
  const at::Tensor fc = swiglu(w.ffc_in.forward(flux2_modulate(encoder, mc[3], mc[4], c.eps)));
  out = parallel::rowwise_forward(parallel::RowwiseBatch().add(w.ff_out, fx).add(w.ffc_out, fc));
  hidden = hidden + m[5].unsqueeze(1) * out[0];
  encoder = clip_fp16(encoder + mc[5].unsqueeze(1) * out[1]);
}

void flux2_single_block_forward(const Flux2SingleBlockWeights& w, const Flux2Config& c, const at::Tensor& mod,
                                const nn::Rope& rope, at::Tensor& joint, int64_t attention_chunk) {
  auto m = mod.chunk(3, 1);  // shift, scale, gate
  const at::Tensor proj = w.to_qkv_mlp.forward(flux2_modulate(joint, m[0], m[1], c.eps));
  // Split this rank's [q_r, k_r, v_r, gate_r, up_r] by the global QKV : MLP
  // ratio (packed sharding keeps it on every rank).
  const int64_t qkv_dim = 3 * c.inner(), mlp_dim = 2 * c.mlp_hidden();
  const int64_t local_qkv = proj.size(-1) * qkv_dim / (qkv_dim + mlp_dim);
  auto qkv = proj.narrow(-1, 0, local_qkv).chunk(3, -1);
  const at::Tensor mlp = swiglu(proj.narrow(-1, local_qkv, proj.size(-1) - local_qkv));

  const int64_t hd = c.head_dim;
  const at::Tensor q = nn::apply_rope(heads_of(qkv[0], hd, &w.norm_q, c.eps), rope);
  const at::Tensor k = nn::apply_rope(heads_of(qkv[1], hd, &w.norm_k, c.eps), rope);
  const at::Tensor v = heads_of(qkv[2], hd, nullptr, c.eps);
  const at::Tensor attn = merge_heads(nn::attention(q, k, v, w.to_qkv_mlp.tp().size, attention_chunk));
  // to_out is packed rowwise over [attn (inner), mlp (mlp_hidden)]: this
  // rank's input is its attention heads followed by its mlp slice.
  joint = clip_fp16(joint + m[2].unsqueeze(1) * w.to_out.forward(at::cat({attn, mlp}, -1)));
}

}  // namespace tprun::models
