// AutoencoderKL's blocks over ATen: ResnetBlock2D, the mid-block attention,
// UNetMidBlock2D, UpDecoderBlock2D and DownEncoderBlock2D, and their loading.
#include "models/vae_blocks.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/group_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/upsample_nearest2d.h>

namespace tprun::models {

namespace {

constexpr double kEps = 1e-6;  // resnet_eps / norm eps of diffusers' Encoder and Decoder

TensorPtr load_one(checkpoint::ShardLoader& loader, const std::string& name) {
  return std::make_shared<at::Tensor>(loader.load(name, checkpoint::ShardRequest{}));
}

}  // namespace

Affine load_affine(checkpoint::ShardLoader& loader, const std::string& prefix) {
  return {load_one(loader, prefix + ".weight"), load_one(loader, prefix + ".bias")};
}

ResnetWeights load_resnet(checkpoint::ShardLoader& loader, const std::string& prefix, bool has_shortcut) {
  ResnetWeights r;
  r.norm1 = load_affine(loader, prefix + ".norm1");
  r.conv1 = load_affine(loader, prefix + ".conv1");
  r.norm2 = load_affine(loader, prefix + ".norm2");
  r.conv2 = load_affine(loader, prefix + ".conv2");
  r.has_shortcut = has_shortcut;
  if (has_shortcut) r.conv_shortcut = load_affine(loader, prefix + ".conv_shortcut");
  return r;
}

AttentionWeights load_attention(checkpoint::ShardLoader& loader, const std::string& prefix) {
  AttentionWeights a;
  a.group_norm = load_affine(loader, prefix + ".group_norm");
  const Affine q = load_affine(loader, prefix + ".to_q");
  const Affine k = load_affine(loader, prefix + ".to_k");
  const Affine v = load_affine(loader, prefix + ".to_v");
  // One GEMM for Q, K and V: rows [0,C) are Q, [C,2C) K, [2C,3C) V.
  a.qkv.weight = std::make_shared<at::Tensor>(at::cat({*q.weight, *k.weight, *v.weight}, 0));
  a.qkv.bias = std::make_shared<at::Tensor>(at::cat({*q.bias, *k.bias, *v.bias}, 0));
  a.to_out = load_affine(loader, prefix + ".to_out.0");
  return a;
}

at::Tensor conv2d(const at::Tensor& x, const Affine& w, int64_t stride, int64_t padding) {
  return at::conv2d(x, *w.weight, *w.bias, {stride, stride}, {padding, padding});
}

at::Tensor group_norm(const at::Tensor& x, const Affine& w, int64_t groups) {
  return at::group_norm(x, groups, *w.weight, *w.bias, kEps);
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

at::Tensor attention_forward(const AttentionWeights& w, const at::Tensor& x, int64_t groups) {
  const int64_t b = x.size(0), c = x.size(1), hgt = x.size(2), wid = x.size(3);
  // GroupNorm over channels of [B, C, H, W] equals diffusers' norm of [B, C, H*W].
  at::Tensor tokens = group_norm(x, w.group_norm, groups).reshape({b, c, hgt * wid}).transpose(1, 2);  // [B, N, C]
  at::Tensor qkv = at::linear(tokens, *w.qkv.weight, *w.qkv.bias);                                     // [B, N, 3C]
  auto parts = qkv.unsqueeze(1).chunk(3, -1);  // one head: [B, 1, N, C] each
  // softmax(Q K^T / sqrt(C)) V without materialising Q K^T where the backend can.
  at::Tensor attn = at::scaled_dot_product_attention(parts[0], parts[1], parts[2]).squeeze(1);  // [B, N, C]
  at::Tensor out = at::linear(attn, *w.to_out.weight, *w.to_out.bias);
  // residual_connection, rescale_output_factor 1 (x first: the sum keeps x's NCHW layout).
  return x + out.transpose(1, 2).reshape({b, c, hgt, wid});
}

at::Tensor mid_block_forward(const MidBlockWeights& w, const at::Tensor& x, int64_t groups) {
  at::Tensor h = resnet_forward(w.resnets.at(0), x, groups);
  for (size_t i = 1; i < w.resnets.size(); ++i) {
    if (!w.attentions.empty()) h = attention_forward(w.attentions.at(i - 1), h, groups);
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
