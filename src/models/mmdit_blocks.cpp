// The MMDiT pieces the dual-stream families share (see mmdit_blocks.h).
#include "models/mmdit_blocks.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>

namespace tprun::models::mmdit {

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  return (1 + scale.unsqueeze(1)) * nn::layer_norm(x, eps) + shift.unsqueeze(1);
}

at::Tensor add_gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return x + gate.unsqueeze(1) * y;
}

at::Tensor split_heads(const at::Tensor& y, int64_t head_dim, const parallel::Weight* norm, double eps) {
  at::Tensor t = y.unflatten(-1, {-1, head_dim});
  if (norm) t = nn::rms_norm(t, norm->get(), eps);
  return t.transpose(1, 2);
}

at::Tensor merge_heads(const at::Tensor& heads) { return heads.transpose(1, 2).flatten(2); }

at::Tensor rope_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const nn::Rope& rope,
                          int64_t tp_share, int64_t attention_chunk) {
  const at::Tensor q_rot = nn::apply_rope(q, rope);
  const at::Tensor k_rot = nn::apply_rope(k, rope);
  return merge_heads(nn::attention(q_rot, k_rot, v, tp_share, attention_chunk));
}

at::Tensor clip_fp16(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? at::clamp(x, -65504, 65504) : x;
}

StreamPair rowwise_pair(const parallel::ParallelLinear& image_out, const at::Tensor& image_in,
                        const parallel::ParallelLinear& text_out, const at::Tensor& text_in) {
  auto out = parallel::rowwise_forward(parallel::RowwiseBatch().add(image_out, image_in).add(text_out, text_in));
  return {out[0], out[1]};
}

StreamPair joint_attention(const JointAttentionWeights& w, int64_t head_dim, double eps, const at::Tensor& image,
                           const at::Tensor& text, const nn::Rope& rope, int64_t attention_chunk) {
  return joint_attention(w, head_dim, eps, image, text, rope, attention_chunk, JointAttentionOptions{});
}

namespace {

// split_heads with the QK norm of `kind` (nullptr: none).
at::Tensor heads_of(const at::Tensor& y, int64_t head_dim, const parallel::Weight* norm, double eps, QkNorm kind) {
  if (kind == QkNorm::Torch || norm == nullptr) return split_heads(y, head_dim, norm, eps);
  return nn::diffusers_rms_norm(y.unflatten(-1, {-1, head_dim}), norm->get(), eps).transpose(1, 2);
}

}  // namespace

StreamPair joint_attention(const JointAttentionWeights& w, int64_t head_dim, double eps, const at::Tensor& image,
                           const at::Tensor& text, const nn::Rope& rope, int64_t attention_chunk,
                           const JointAttentionOptions& options) {
  const QkNorm n = options.qk_norm;
  // Tokens in [text, image] order, this rank's heads only.
  const at::Tensor q = at::cat({heads_of(w.add_q.forward(text), head_dim, &w.norm_added_q, eps, n),
                                heads_of(w.to_q.forward(image), head_dim, &w.norm_q, eps, n)}, 2);
  const at::Tensor k = at::cat({heads_of(w.add_k.forward(text), head_dim, &w.norm_added_k, eps, n),
                                heads_of(w.to_k.forward(image), head_dim, &w.norm_k, eps, n)}, 2);
  const at::Tensor v = at::cat({heads_of(w.add_v.forward(text), head_dim, nullptr, eps, n),
                                heads_of(w.to_v.forward(image), head_dim, nullptr, eps, n)}, 2);
  at::Tensor attn;
  if (options.key_mask.defined()) {
    const at::Tensor mask = options.key_mask.to(q.device(), at::kBool).unsqueeze(1).unsqueeze(1);  // [B, 1, 1, S]
    attn = merge_heads(nn::masked_attention(nn::apply_rope(q, rope), nn::apply_rope(k, rope), v, mask,
                                            w.to_q.tp().size, attention_chunk));
  } else {
    attn = rope_attention(q, k, v, rope, w.to_q.tp().size, attention_chunk);
  }
  const int64_t text_tokens = text.size(1);
  const at::Tensor attn_text = attn.narrow(1, 0, text_tokens).contiguous();
  const at::Tensor attn_image = attn.narrow(1, text_tokens, attn.size(1) - text_tokens).contiguous();
  return rowwise_pair(w.to_out, attn_image, w.to_add_out, attn_text);
}

at::Tensor MlpEmbedder::forward(const at::Tensor& x) const { return linear_2.forward(nn::silu(linear_1.forward(x))); }

MlpEmbedder declare_mlp_embedder(ModelBuilder& b, const std::string& prefix, int64_t out, int64_t in,
                                 const LinearDecl& decl) {
  MlpEmbedder e;
  e.linear_1 = b.linear(prefix + "linear_1", out, in, decl);
  e.linear_2 = b.linear(prefix + "linear_2", out, out, decl);
  return e;
}

at::Tensor embed_timestep(const MlpEmbedder& embedder, const at::Tensor& t, int64_t channels,
                          const ToCompute& to_compute) {
  const at::Tensor scaled = to_compute(t) * 1000;
  return embedder.forward(to_compute(nn::timestep_embedding(scaled, channels, true, 0)));
}

at::Tensor ada_norm_continuous(const parallel::ParallelLinear& linear, const at::Tensor& act, const at::Tensor& x,
                               double eps) {
  auto scale_shift = linear.forward(act).chunk(2, 1);
  return modulate(x, scale_shift[1], scale_shift[0], eps);
}

}  // namespace tprun::models::mmdit
