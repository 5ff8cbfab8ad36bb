// The double-stream and single-stream blocks of FluxTransformer2DModel, per
// TP rank (see flux_transformer.h for the communication plan).
#include "models/flux_blocks.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>

#include "dist/communicator.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

// LayerNorm (no affine, eps 1e-6) then x * (1 + scale) + shift, [B, D] broadcast over tokens.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return nn::layer_norm(x, 1e-6) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

// [B, S, h*D] -> [B, h, S, D], with the per-head RMSNorm when given.
at::Tensor heads_of(const at::Tensor& y, int64_t head_dim, const TensorPtr& norm) {
  at::Tensor t = y.unflatten(-1, {-1, head_dim});
  if (norm) t = nn::rms_norm(t, *norm, 1e-6);
  return t.transpose(1, 2);
}

// [B, h, S, D] -> [B, S, h*D]
at::Tensor merge_heads(const at::Tensor& t) { return t.transpose(1, 2).flatten(2); }

at::Tensor clip_fp16(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? at::clamp(x, -65504, 65504) : x;
}

}  // namespace

std::vector<at::Tensor> all_reduce_coalesced(const parallel::TpContext& tp, const std::vector<at::Tensor>& partials) {
  if (tp.size == 1) return partials;
  if (!tp.comm) throw Error(Error::Kind::Internal, "tp > 1 without a communicator");
  std::vector<at::Tensor> flat;
  flat.reserve(partials.size());
  for (const auto& p : partials) flat.push_back(p.reshape({-1}));
  // One partial: reduce it in place (it is a fresh output nobody else holds).
  at::Tensor buf = flat.size() == 1 ? flat[0].contiguous() : at::cat(flat, 0);
  tp.comm->all_reduce(buf);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& p : partials) {
    out.push_back(buf.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

void double_block_forward(const DoubleBlockWeights& w, const parallel::TpContext& tp, int64_t head_dim,
                          const at::Tensor& mod, const at::Tensor& mod_context, const nn::Rope& rope,
                          at::Tensor& hidden, at::Tensor& encoder) {
  // AdaLayerNormZero: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  auto m = mod.chunk(6, 1);
  auto mc = mod_context.chunk(6, 1);
  at::Tensor nx = modulate(hidden, m[0], m[1]);
  at::Tensor nc = modulate(encoder, mc[0], mc[1]);

  // Joint attention over [text, image], this rank's heads only.
  at::Tensor q = at::cat({heads_of(w.add_q.forward(nc), head_dim, w.norm_added_q),
                          heads_of(w.to_q.forward(nx), head_dim, w.norm_q)}, 2);
  at::Tensor k = at::cat({heads_of(w.add_k.forward(nc), head_dim, w.norm_added_k),
                          heads_of(w.to_k.forward(nx), head_dim, w.norm_k)}, 2);
  at::Tensor v = at::cat({heads_of(w.add_v.forward(nc), head_dim, nullptr),
                          heads_of(w.to_v.forward(nx), head_dim, nullptr)}, 2);
  q = nn::apply_rope(q, rope);
  k = nn::apply_rope(k, rope);
  at::Tensor attn = merge_heads(nn::attention(q, k, v));
  const int64_t txt = encoder.size(1);
  at::Tensor attn_txt = attn.narrow(1, 0, txt).contiguous();
  at::Tensor attn_img = attn.narrow(1, txt, attn.size(1) - txt).contiguous();

  // One AllReduce closes both streams' attention output projections.
  auto red = all_reduce_coalesced(tp, {w.to_out.forward(attn_img), w.to_add_out.forward(attn_txt)});
  hidden = hidden + m[2].unsqueeze(1) * w.to_out.add_bias(red[0]);
  encoder = encoder + mc[2].unsqueeze(1) * w.to_add_out.add_bias(red[1]);

  // Feed-forwards (GELU-tanh), one AllReduce for both streams.
  at::Tensor fx = w.ff_out.forward(nn::gelu_tanh(w.ff_in.forward(modulate(hidden, m[3], m[4]))));
  at::Tensor fc = w.ffc_out.forward(nn::gelu_tanh(w.ffc_in.forward(modulate(encoder, mc[3], mc[4]))));
  red = all_reduce_coalesced(tp, {fx, fc});
  hidden = hidden + m[5].unsqueeze(1) * w.ff_out.add_bias(red[0]);
  encoder = clip_fp16(encoder + mc[5].unsqueeze(1) * w.ffc_out.add_bias(red[1]));
}

void single_block_forward(const SingleBlockWeights& w, const parallel::TpContext& tp, int64_t head_dim,
                          const at::Tensor& mod, const nn::Rope& rope, at::Tensor& hidden, at::Tensor& encoder) {
  const int64_t txt = encoder.size(1);
  at::Tensor x = at::cat({encoder, hidden}, 1);
  // AdaLayerNormZeroSingle: shift_msa, scale_msa, gate_msa.
  auto m = mod.chunk(3, 1);
  at::Tensor n = modulate(x, m[0], m[1]);
  at::Tensor mlp = nn::gelu_tanh(w.proj_mlp.forward(n));
  at::Tensor q = nn::apply_rope(heads_of(w.to_q.forward(n), head_dim, w.norm_q), rope);
  at::Tensor k = nn::apply_rope(heads_of(w.to_k.forward(n), head_dim, w.norm_k), rope);
  at::Tensor v = heads_of(w.to_v.forward(n), head_dim, nullptr);
  at::Tensor attn = merge_heads(nn::attention(q, k, v));
  // proj_out is packed rowwise over [attn (inner), mlp (mlp_hidden)]: this
  // rank's input is its attention heads followed by its mlp slice.
  auto red = all_reduce_coalesced(tp, {w.proj_out.forward(at::cat({attn, mlp}, 2))});
  x = clip_fp16(x + m[2].unsqueeze(1) * w.proj_out.add_bias(red[0]));
  encoder = x.narrow(1, 0, txt);
  hidden = x.narrow(1, txt, x.size(1) - txt);
}

}  // namespace tprun::models
