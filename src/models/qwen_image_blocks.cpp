// The declarations and the dual-stream block of QwenImageTransformer2DModel,
// per TP rank (see qwen_image_blocks.h for the math, qwen_image_transformer.h
// for the communication plan).
#include "models/qwen_image_blocks.h"

#include <cmath>
#include <utility>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/where.h>
#include <fmt/format.h>

namespace tprun::models {
namespace {

QwenMlpWeights declare_mlp(ModelBuilder& b, const std::string& prefix, int64_t dim, int64_t hidden) {
  QwenMlpWeights m;
  m.proj = b.linear(prefix + "net.0.proj", hidden, dim, LinearDecl::colwise().with_bias());
  m.out = b.linear(prefix + "net.2", dim, hidden, LinearDecl::rowwise().with_bias());
  return m;
}

}  // namespace

QwenImageWeights declare_qwen_image(const QwenImageConfig& c, bool shard_modulation, ModelBuilder& b) {
  using checkpoint::ShardStyle;
  const int64_t inner = c.inner();
  const LinearDecl plain = LinearDecl::replicated().with_bias();
  const LinearDecl col = LinearDecl::colwise().with_bias();
  const LinearDecl row = LinearDecl::rowwise().with_bias();
  const LinearDecl modulation =
      LinearDecl::of(shard_modulation ? ShardStyle::RowwiseSplitInput : ShardStyle::Replicated).with_bias();
  b.tp_divides("num_attention_heads", c.heads);

  QwenImageWeights w;
  w.timestep_embedder = mmdit::declare_mlp_embedder(b, "time_text_embed.timestep_embedder.", inner,
                                                    c.timestep_channels, plain);
  if (c.additional_t_cond) {
    w.addition_t_embedding = b.tensor("time_text_embed.addition_t_embedding.weight", {2, inner}, TensorKind::Embedding);
  }
  w.txt_norm = b.tensor("txt_norm.weight", {c.joint_dim}, TensorKind::Norm);
  w.img_in = b.linear("img_in", inner, c.in_channels, plain);
  w.txt_in = b.linear("txt_in", inner, c.joint_dim, plain);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    QwenBlockWeights blk;
    blk.img_mod = b.linear(p + "img_mod.1", 6 * inner, inner, modulation);
    mmdit::JointAttentionWeights& a = blk.attn;
    a.norm_q = b.tensor(p + "attn.norm_q.weight", {c.head_dim}, TensorKind::Norm);
    a.norm_k = b.tensor(p + "attn.norm_k.weight", {c.head_dim}, TensorKind::Norm);
    a.to_q = b.linear(p + "attn.to_q", inner, inner, col);
    a.to_k = b.linear(p + "attn.to_k", inner, inner, col);
    a.to_v = b.linear(p + "attn.to_v", inner, inner, col);
    a.add_k = b.linear(p + "attn.add_k_proj", inner, inner, col);
    a.add_v = b.linear(p + "attn.add_v_proj", inner, inner, col);
    a.add_q = b.linear(p + "attn.add_q_proj", inner, inner, col);
    a.to_out = b.linear(p + "attn.to_out.0", inner, inner, row);
    a.to_add_out = b.linear(p + "attn.to_add_out", inner, inner, row);
    a.norm_added_q = b.tensor(p + "attn.norm_added_q.weight", {c.head_dim}, TensorKind::Norm);
    a.norm_added_k = b.tensor(p + "attn.norm_added_k.weight", {c.head_dim}, TensorKind::Norm);
    blk.img_mlp = declare_mlp(b, p + "img_mlp.", inner, c.mlp_hidden());
    blk.txt_mod = b.linear(p + "txt_mod.1", 6 * inner, inner, modulation);
    blk.txt_mlp = declare_mlp(b, p + "txt_mlp.", inner, c.mlp_hidden());
    w.blocks.push_back(std::move(blk));
  }
  w.norm_out = b.linear("norm_out.linear", 2 * inner, inner, plain);
  w.proj_out = b.linear("proj_out", c.patch * c.patch * c.out_channels, inner, plain);
  return w;
}

at::Tensor qwen_timestep_features(const at::Tensor& t, int64_t channels) {
  const int64_t half = channels / 2;
  const auto f32 = t.options().dtype(at::kFloat);
  const at::Tensor exponent = at::arange(0, half, f32) * (-std::log(10000.0)) / static_cast<double>(half);
  const at::Tensor freqs = at::exp(exponent);  // fp32, whatever t's dtype
  const at::Tensor angles = (t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0)) * 1000;
  return at::cat({at::cos(angles), at::sin(angles)}, -1);  // flip_sin_to_cos
}

namespace {

// The six (shift, scale, gate) x 2 chunks of a stream's modulation as
// [B, 1, D], or with zero_cond_t's choice per token ([1, S, 1], true = the
// conditioning images: the second half of the [2 B, 6 D] modulation) as [B, S, D].
std::vector<at::Tensor> modulation_chunks(const at::Tensor& mod, const at::Tensor& second) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& m : mod.chunk(6, 1)) {
    if (!second.defined()) {
      out.push_back(m.unsqueeze(1));
    } else {
      const int64_t b = m.size(0) / 2;
      out.push_back(at::where(second, m.narrow(0, b, b).unsqueeze(1), m.narrow(0, 0, b).unsqueeze(1)));
    }
  }
  return out;
}

// LayerNorm(x) * (1 + scale) + shift with token-shaped shift and scale.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  return nn::layer_norm(x, eps) * (1 + scale) + shift;
}

}  // namespace

void qwen_block_forward(const QwenBlockWeights& w, const QwenImageConfig& c, const at::Tensor& img_mod,
                        const at::Tensor& txt_mod, const at::Tensor& conditioning_tokens, const nn::Rope& rope,
                        const at::Tensor& key_mask, at::Tensor& hidden, at::Tensor& encoder,
                        int64_t attention_chunk) {
  // (shift, scale, gate) before attention, then before the MLP.
  const std::vector<at::Tensor> m = modulation_chunks(img_mod, conditioning_tokens);
  const std::vector<at::Tensor> mc = modulation_chunks(txt_mod, at::Tensor());
  const at::Tensor nx = modulate(hidden, m[0], m[1], c.eps);
  const at::Tensor nc = modulate(encoder, mc[0], mc[1], c.eps);

  mmdit::JointAttentionOptions options;
  options.qk_norm = mmdit::QkNorm::Diffusers;
  options.key_mask = key_mask;
  mmdit::StreamPair out = mmdit::joint_attention(w.attn, c.head_dim, c.eps, nx, nc, rope, attention_chunk, options);
  hidden = hidden + m[2] * out.image;
  encoder = encoder + mc[2] * out.text;

  // GELU (tanh) MLPs; both net.2 partial sums close with one AllReduce.
  const at::Tensor fx = nn::gelu_tanh(w.img_mlp.proj.forward(modulate(hidden, m[3], m[4], c.eps)));
  const at::Tensor fc = nn::gelu_tanh(w.txt_mlp.proj.forward(modulate(encoder, mc[3], mc[4], c.eps)));
  out = mmdit::rowwise_pair(w.img_mlp.out, fx, w.txt_mlp.out, fc);
  hidden = mmdit::clip_fp16(hidden + m[5] * out.image);
  encoder = mmdit::clip_fp16(encoder + mc[5] * out.text);
}

}  // namespace tprun::models
