// AutoencoderKL's blocks over ATen: ResnetBlock2D, the mid-block attention,
// UNetMidBlock2D, UpDecoderBlock2D and DownEncoderBlock2D, and their loading.
#include "models/vae_blocks.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/group_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/upsample_nearest2d.h>

#include "models/conv_ops.h"
#include "models/nn_ops.h"

namespace tprun::models {

namespace {

constexpr double kEps = 1e-6;  // resnet_eps / norm eps of diffusers' Encoder and Decoder

}  // namespace

ResnetWeights declare_resnet(ModelBuilder& b, const std::string& prefix, int64_t in, int64_t out) {
  ResnetWeights r;
  r.norm1 = b.norm(prefix + ".norm1", in);
  r.conv1 = b.conv2d(prefix + ".conv1", out, in, 3);
  r.norm2 = b.norm(prefix + ".norm2", out);
  r.conv2 = b.conv2d(prefix + ".conv2", out, out, 3);
  r.has_shortcut = in != out;
  if (r.has_shortcut) r.conv_shortcut = b.conv2d(prefix + ".conv_shortcut", out, in, 1);
  return r;
}

AttentionWeights declare_attention(ModelBuilder& b, const std::string& prefix, int64_t ch) {
  AttentionWeights a;
  a.group_norm = b.norm(prefix + ".group_norm", ch);
  a.to_q = b.linear(prefix + ".to_q", ch, ch, LinearDecl::replicated().with_bias());
  a.to_k = b.linear(prefix + ".to_k", ch, ch, LinearDecl::replicated().with_bias());
  a.to_v = b.linear(prefix + ".to_v", ch, ch, LinearDecl::replicated().with_bias());
  a.to_out = b.linear(prefix + ".to_out.0", ch, ch, LinearDecl::replicated().with_bias());
  return a;
}

MidBlockWeights declare_mid_block(ModelBuilder& b, const std::string& prefix, int64_t ch, bool attention) {
  MidBlockWeights mid;
  if (attention) mid.attentions.push_back(declare_attention(b, prefix + ".attentions.0", ch));
  mid.resnets.push_back(declare_resnet(b, prefix + ".resnets.0", ch, ch));
  mid.resnets.push_back(declare_resnet(b, prefix + ".resnets.1", ch, ch));
  return mid;
}

at::Tensor conv2d(const at::Tensor& x, const Affine& w, int64_t stride, int64_t padding) {
  return nn::conv2d(x, w.weight.get(), w.bias.get(), stride, padding);
}

at::Tensor group_norm(const at::Tensor& x, const Affine& w, int64_t groups) {
  return at::group_norm(x, groups, w.weight.get(), w.bias.get(), kEps);
}

namespace {

// silu(group_norm(x)), the SiLU in place on the fresh norm output.
at::Tensor norm_silu(const at::Tensor& x, const Affine& w, int64_t groups) {
  at::Tensor h = group_norm(x, w, groups);
  at::silu_(h);
  return h;
}

}  // namespace

at::Tensor resnet_forward(const ResnetWeights& w, const at::Tensor& x, int64_t groups) {
  // Fresh intermediates: SiLU in place, the residual added in place.
  at::Tensor h = conv2d(norm_silu(x, w.norm1, groups), w.conv1, 1, 1);
  h = conv2d(norm_silu(h, w.norm2, groups), w.conv2, 1, 1);
  if (w.has_shortcut) return h.add_(conv2d(x, w.conv_shortcut, 1, 0));
  return h.add_(x);
}

at::Tensor attention_forward(const AttentionWeights& w, const at::Tensor& x, int64_t groups,
                             int64_t attention_chunk) {
  const int64_t b = x.size(0), c = x.size(1), hgt = x.size(2), wid = x.size(3);
  // GroupNorm over channels of [B, C, H, W] equals diffusers' norm of [B, C, H*W].
  at::Tensor tokens = group_norm(x, w.group_norm, groups).reshape({b, c, hgt * wid}).transpose(1, 2);  // [B, N, C]
  // One head of all channels: [B, 1, N, C] each.
  at::Tensor q = w.to_q.forward(tokens).unsqueeze(1), k = w.to_k.forward(tokens).unsqueeze(1),
             v = w.to_v.forward(tokens).unsqueeze(1);
  // softmax(Q K^T / sqrt(C)) V without materialising Q K^T where the backend can
  // (libtorch's SDPA; the queries in chunks with attention_chunk).
  at::Tensor attn = nn::sdpa(q, k, v, std::nullopt, std::nullopt, attention_chunk).squeeze(1);  // [B, N, C]
  at::Tensor out = w.to_out.forward(attn);
  // residual_connection, rescale_output_factor 1 (x first: the sum keeps x's NCHW layout).
  return x + out.transpose(1, 2).reshape({b, c, hgt, wid});
}

at::Tensor mid_block_forward(const MidBlockWeights& w, const at::Tensor& x, int64_t groups, int64_t attention_chunk) {
  at::Tensor h = resnet_forward(w.resnets.at(0), x, groups);
  for (size_t i = 1; i < w.resnets.size(); ++i) {
    if (!w.attentions.empty()) h = attention_forward(w.attentions.at(i - 1), h, groups, attention_chunk);
    h = resnet_forward(w.resnets[i], h, groups);
  }
  return h;
}

at::Tensor up_block_forward(const SampleBlockWeights& w, const at::Tensor& x, int64_t groups) {
  at::Tensor h = x;
  for (const auto& r : w.resnets) h = resnet_forward(r, h, groups);
  if (w.has_sampler) {
    // Upsample2D: F.interpolate(scale_factor=2, mode="nearest"), then conv 3x3.
    h = at::upsample_nearest2d(h, {2 * h.size(2), 2 * h.size(3)}, 2.0, 2.0);
    h = conv2d(h, w.sampler, 1, 1);
  }
  return h;
}

at::Tensor down_block_forward(const SampleBlockWeights& w, const at::Tensor& x, int64_t groups) {
  at::Tensor h = x;
  for (const auto& r : w.resnets) h = resnet_forward(r, h, groups);
  if (w.has_sampler) {
    // Downsample2D(padding=0): zero pad right and bottom by one, conv 3x3 stride 2.
    h = conv2d(at::constant_pad_nd(h, {0, 1, 0, 1}, 0), w.sampler, 2, 0);
  }
  return h;
}

}  // namespace tprun::models
