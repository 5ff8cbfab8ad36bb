// AutoencoderKLQwenImage's blocks for one frame over ATen (see
// qwen_image_vae_blocks.h for why the causal 3-D convs are 2-D convs here).
#include "models/qwen_image_vae_blocks.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_upsample_nearest_exact2d.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/norm.h>
#include <ATen/ops/silu.h>

#include "models/conv_ops.h"
#include "models/nn_ops.h"
#include "parallel/weight.h"

namespace tprun::models {

namespace {

// The last time tap of a loaded causal conv weight, stored alone (see CausalConvLoad).
void keep_last_tap(parallel::Weight& w, CausalConvLoad& load) {
  if (!load.last_tap_only || !w.defined()) return;
  const at::Tensor full = w.get();
  if (full.dim() != 5) return;
  at::Tensor tap = full.select(2, full.size(2) - 1).contiguous();
  load.bytes_dropped += static_cast<uint64_t>(full.nbytes() - tap.nbytes());
  w = parallel::Weight(w.name(), parallel::resident_storage(tap));
}

}  // namespace

CausalConvWeights declare_causal_conv(ModelBuilder& b, CausalConvLoad& load, const std::string& name, int64_t out,
                                      int64_t in, int64_t kernel) {
  CausalConvWeights c;
  c.weight = b.tensor(name + ".weight", {out, in, kernel, kernel, kernel}, TensorKind::Conv);
  c.bias = b.tensor(name + ".bias", {out}, TensorKind::Bias);
  c.padding = (kernel - 1) / 2;
  keep_last_tap(c.weight, load);
  return c;
}

QwenResidualWeights declare_qwen_residual(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                          int64_t in, int64_t out) {
  // Module order: norm1, conv1, norm2, (dropout), conv2, conv_shortcut.
  QwenResidualWeights r;
  r.norm1 = b.tensor(prefix + ".norm1.gamma", {in, 1, 1, 1}, TensorKind::Norm);
  r.conv1 = declare_causal_conv(b, load, prefix + ".conv1", out, in, 3);
  r.norm2 = b.tensor(prefix + ".norm2.gamma", {out, 1, 1, 1}, TensorKind::Norm);
  r.conv2 = declare_causal_conv(b, load, prefix + ".conv2", out, out, 3);
  r.has_shortcut = in != out;
  if (r.has_shortcut) r.conv_shortcut = declare_causal_conv(b, load, prefix + ".conv_shortcut", out, in, 1);
  return r;
}

QwenAttentionWeights declare_qwen_attention(ModelBuilder& b, const std::string& prefix, int64_t ch) {
  QwenAttentionWeights a;
  a.norm = b.tensor(prefix + ".norm.gamma", {ch, 1, 1}, TensorKind::Norm);
  a.to_qkv = b.conv2d(prefix + ".to_qkv", 3 * ch, ch, 1);
  a.proj = b.conv2d(prefix + ".proj", ch, ch, 1);
  return a;
}

QwenMidBlockWeights declare_qwen_mid_block(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                           int64_t ch) {
  // QwenImageMidBlock registers its attentions before its resnets.
  QwenMidBlockWeights m;
  m.attention = declare_qwen_attention(b, prefix + ".attentions.0", ch);
  m.resnet0 = declare_qwen_residual(b, load, prefix + ".resnets.0", ch, ch);
  m.resnet1 = declare_qwen_residual(b, load, prefix + ".resnets.1", ch, ch);
  return m;
}

QwenResampleWeights declare_qwen_resample(ModelBuilder& b, const std::string& prefix, int64_t ch, bool up,
                                          bool time) {
  QwenResampleWeights r;
  r.up = up;
  r.conv = b.conv2d(prefix + ".resample.1", up ? ch / 2 : ch, ch, 3);
  if (time) {
    // upsample3d: C -> 2C over 3 frames (pad 2 in front); downsample3d: C -> C,
    // stride 2 in time. Neither runs on the first chunk, the only one an image has.
    const int64_t out = up ? 2 * ch : ch;
    b.unused(prefix + ".time_conv.weight", {out, ch, 3, 1, 1}, TensorKind::Conv);
    b.unused(prefix + ".time_conv.bias", {out}, TensorKind::Bias);
  }
  return r;
}

at::Tensor causal_conv_frame(const at::Tensor& x, const CausalConvWeights& w) {
  at::Tensor weight = w.weight.get();
  if (weight.dim() == 5) weight = weight.select(2, weight.size(2) - 1);  // zeros meet every other tap
  return nn::conv2d(x, weight, w.bias.get(), 1, w.padding);
}

at::Tensor qwen_rms_norm(const at::Tensor& x, const parallel::Weight& gamma_w) {
  const at::Tensor gamma = gamma_w.get();
  const bool half = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  const at::Tensor xf = half ? x.to(at::kFloat) : x;
  // F.normalize(x, dim=1): x / clamp_min(||x||_2, 1e-12) over the channels.
  at::Tensor n = xf / at::norm(xf, 2, {1}, true).clamp_min(1e-12);
  if (half) n = n.to(x.scalar_type());
  const double scale = std::sqrt(static_cast<double>(gamma.size(0)));
  return n.mul_(scale).mul_(gamma.reshape({gamma.size(0), 1, 1}));
}

namespace {

// silu(RMS_norm(x)), the SiLU in place on the fresh norm output.
at::Tensor norm_silu(const at::Tensor& x, const parallel::Weight& gamma) {
  at::Tensor h = qwen_rms_norm(x, gamma);
  at::silu_(h);
  return h;
}

}  // namespace

at::Tensor qwen_residual_forward(const QwenResidualWeights& w, const at::Tensor& x) {
  const at::Tensor shortcut = w.has_shortcut ? causal_conv_frame(x, w.conv_shortcut) : x;
  at::Tensor h = causal_conv_frame(norm_silu(x, w.norm1), w.conv1);
  h = causal_conv_frame(norm_silu(h, w.norm2), w.conv2);
  return h.add_(shortcut);
}

at::Tensor qwen_attention_forward(const QwenAttentionWeights& w, const at::Tensor& x, int64_t attention_chunk) {
  const int64_t b = x.size(0), c = x.size(1), hgt = x.size(2), wid = x.size(3);
  const at::Tensor n = qwen_rms_norm(x, w.norm);
  at::Tensor qkv = nn::conv2d(n, w.to_qkv.weight.get(), w.to_qkv.bias.get(), 1, 0);  // [B, 3C, H, W]
  // [B, 1, H*W, 3C], then q, k, v are its three channel thirds.
  qkv = qkv.reshape({b, 1, 3 * c, hgt * wid}).permute({0, 1, 3, 2}).contiguous();
  auto parts = qkv.chunk(3, -1);
  at::Tensor attn = nn::sdpa(parts[0], parts[1], parts[2], std::nullopt, std::nullopt, attention_chunk);
  attn = attn.squeeze(1).permute({0, 2, 1}).reshape({b, c, hgt, wid});
  return nn::conv2d(attn, w.proj.weight.get(), w.proj.bias.get(), 1, 0).add_(x);
}

at::Tensor qwen_resample_forward(const QwenResampleWeights& w, const at::Tensor& x) {
  if (w.up) {
    // QwenImageUpsample: nearest-exact x2 in fp32, back to the input dtype.
    at::Tensor up = at::_upsample_nearest_exact2d(x.to(at::kFloat), {2 * x.size(2), 2 * x.size(3)}, 2.0, 2.0);
    return nn::conv2d(up.to(x.scalar_type()), w.conv.weight.get(), w.conv.bias.get(), 1, 1);
  }
  const at::Tensor padded = at::constant_pad_nd(x, {0, 1, 0, 1}, 0);
  return nn::conv2d(padded, w.conv.weight.get(), w.conv.bias.get(), 2, 0);
}

at::Tensor qwen_mid_block_forward(const QwenMidBlockWeights& w, const at::Tensor& x, int64_t attention_chunk) {
  at::Tensor h = qwen_residual_forward(w.resnet0, x);
  h = qwen_attention_forward(w.attention, h, attention_chunk);
  return qwen_residual_forward(w.resnet1, h);
}

}  // namespace tprun::models
