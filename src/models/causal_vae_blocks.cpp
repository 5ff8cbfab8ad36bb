// The causal 3-D VAEs' blocks: declarations (AutoencoderKLQwenImage and
// AutoencoderKLWan alike) and the one-frame forwards over ATen (see
// causal_vae_blocks.h for why the causal 3-D convs are 2-D convs there).
#include "models/causal_vae_blocks.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_upsample_nearest_exact2d.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/norm.h>
#include <ATen/ops/silu.h>
#include <fmt/format.h>

#include "checkpoint/torch_dtype.h"
#include "models/conv_ops.h"
#include "models/nn_ops.h"
#include "parallel/weight.h"
#include "runtime/error.h"

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
  c.time_pad = 2 * c.padding;
  keep_last_tap(c.weight, load);
  return c;
}

CausalResidualWeights declare_causal_residual(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                          int64_t in, int64_t out) {
  // Module order: norm1, conv1, norm2, (dropout), conv2, conv_shortcut.
  CausalResidualWeights r;
  r.norm1 = b.tensor(prefix + ".norm1.gamma", {in, 1, 1, 1}, TensorKind::Norm);
  r.conv1 = declare_causal_conv(b, load, prefix + ".conv1", out, in, 3);
  r.norm2 = b.tensor(prefix + ".norm2.gamma", {out, 1, 1, 1}, TensorKind::Norm);
  r.conv2 = declare_causal_conv(b, load, prefix + ".conv2", out, out, 3);
  r.has_shortcut = in != out;
  if (r.has_shortcut) r.conv_shortcut = declare_causal_conv(b, load, prefix + ".conv_shortcut", out, in, 1);
  return r;
}

CausalAttentionWeights declare_causal_attention(ModelBuilder& b, const std::string& prefix, int64_t ch) {
  CausalAttentionWeights a;
  a.norm = b.tensor(prefix + ".norm.gamma", {ch, 1, 1}, TensorKind::Norm);
  a.to_qkv = b.conv2d(prefix + ".to_qkv", 3 * ch, ch, 1);
  a.proj = b.conv2d(prefix + ".proj", ch, ch, 1);
  return a;
}

CausalMidBlockWeights declare_causal_mid_block(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                           int64_t ch) {
  // QwenImageMidBlock registers its attentions before its resnets.
  CausalMidBlockWeights m;
  m.attention = declare_causal_attention(b, prefix + ".attentions.0", ch);
  m.resnet0 = declare_causal_residual(b, load, prefix + ".resnets.0", ch, ch);
  m.resnet1 = declare_causal_residual(b, load, prefix + ".resnets.1", ch, ch);
  return m;
}

CausalResampleWeights declare_causal_resample(ModelBuilder& b, const std::string& prefix,
                                              int64_t ch, bool up, bool time, bool load_time_conv) {
  CausalResampleWeights r;
  r.up = up;
  r.time = time;
  r.conv = b.conv2d(prefix + ".resample.1", up ? ch / 2 : ch, ch, 3);
  if (time) {
    // upsample3d: C -> 2C over 3 frames (pad 2 in front); downsample3d: C -> C,
    // stride 2 in time. Neither runs on the first chunk, the only one an image has.
    const int64_t out = up ? 2 * ch : ch;
    if (load_time_conv) {
      // Module order: resample, then time_conv. Never trimmed to a tap: it always meets frames.
      r.time_conv.weight = b.tensor(prefix + ".time_conv.weight", {out, ch, 3, 1, 1}, TensorKind::Conv);
      r.time_conv.bias = b.tensor(prefix + ".time_conv.bias", {out}, TensorKind::Bias);
      r.time_conv.time_pad = up ? 2 : 0;
      r.time_conv.time_stride = up ? 1 : 2;
    } else {
      b.unused(prefix + ".time_conv.weight", {out, ch, 3, 1, 1}, TensorKind::Conv);
      b.unused(prefix + ".time_conv.bias", {out}, TensorKind::Bias);
    }
  }
  return r;
}

CausalVaeWeights declare_causal_vae(const CausalVaeLayout& cfg, ModelBuilder& b, CausalConvLoad& load) {
  CausalVaeWeights w;
  const size_t n = cfg.dim_mult.size();

  CausalEncoderWeights& e = w.encoder;
  e.conv_in = declare_causal_conv(b, load, "encoder.conv_in", cfg.encoder_dim(0), cfg.in_channels, 3);
  int64_t index = 0;  // down_blocks is one flat list: resnets and resamplers
  for (size_t i = 0; i < n; ++i) {
    int64_t in = cfg.encoder_dim(i);
    const int64_t out = cfg.encoder_dim(i + 1);
    for (int64_t r = 0; r < cfg.num_res_blocks; ++r) {
      CausalDownLayer layer;
      layer.resnet = declare_causal_residual(b, load, fmt::format("encoder.down_blocks.{}", index++), in, out);
      e.down.push_back(std::move(layer));
      in = out;
    }
    if (i + 1 < n) {
      CausalDownLayer layer;
      layer.is_resample = true;
      layer.resample = declare_causal_resample(b, fmt::format("encoder.down_blocks.{}", index++), out, false,
                                               cfg.temperal_downsample[i], cfg.time_convs);
      e.down.push_back(std::move(layer));
    }
  }
  const int64_t top = cfg.encoder_dim(n);
  e.mid = declare_causal_mid_block(b, load, "encoder.mid_block", top);
  e.norm_out = b.tensor("encoder.norm_out.gamma", {top, 1, 1, 1}, TensorKind::Norm);
  e.conv_out = declare_causal_conv(b, load, "encoder.conv_out", 2 * cfg.z_dim, top, 3);  // mean and logvar

  w.quant_conv = declare_causal_conv(b, load, "quant_conv", 2 * cfg.z_dim, 2 * cfg.z_dim, 1);
  w.post_quant_conv = declare_causal_conv(b, load, "post_quant_conv", cfg.z_dim, cfg.z_dim, 1);

  // Decoder widths: decoder_top(), then the levels from the last to the first.
  CausalDecoderWeights& d = w.decoder;
  int64_t width = cfg.decoder_top();
  d.conv_in = declare_causal_conv(b, load, "decoder.conv_in", width, cfg.z_dim, 3);
  d.mid = declare_causal_mid_block(b, load, "decoder.mid_block", width);
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = i == 0 ? width : width / 2;  // the previous upsampler halved it
    const int64_t out = cfg.decoder_base_dim * cfg.dim_mult[n - 1 - i];
    CausalUpBlockWeights blk;
    for (int64_t r = 0; r <= cfg.num_res_blocks; ++r) {
      blk.resnets.push_back(declare_causal_residual(b, load, fmt::format("decoder.up_blocks.{}.resnets.{}", i, r),
                                                    r == 0 ? in : out, out));
    }
    blk.has_upsampler = i + 1 < n;
    if (blk.has_upsampler) {
      // temperal_upsample = reversed(temperal_downsample)
      blk.upsampler = declare_causal_resample(b, fmt::format("decoder.up_blocks.{}.upsamplers.0", i), out, true,
                                              cfg.temperal_downsample[n - 2 - i], cfg.time_convs);
    }
    d.up.push_back(std::move(blk));
    width = out;
  }
  d.norm_out = b.tensor("decoder.norm_out.gamma", {width, 1, 1, 1}, TensorKind::Norm);
  d.conv_out = declare_causal_conv(b, load, "decoder.conv_out", cfg.out_channels, width, 3);
  return w;
}

at::Tensor causal_conv_frame(const at::Tensor& x, const CausalConvWeights& w) {
  at::Tensor weight = w.weight.get();
  if (weight.dim() == 5) weight = weight.select(2, weight.size(2) - 1);  // zeros meet every other tap
  return nn::conv2d(x, weight, w.bias.get(), 1, w.padding);
}

at::Tensor causal_rms_norm(const at::Tensor& x, const parallel::Weight& gamma_w) {
  const at::Tensor gamma = gamma_w.get();
  const bool half = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  const at::Tensor xf = half ? x.to(at::kFloat) : x;
  // F.normalize(x, dim=1): x / clamp_min(||x||_2, 1e-12) over the channels.
  at::Tensor n = xf / at::norm(xf, 2, {1}, true).clamp_min(1e-12);
  if (half) n = n.to(x.scalar_type());
  const double scale = std::sqrt(static_cast<double>(gamma.size(0)));
  std::vector<int64_t> shape(static_cast<size_t>(x.dim() - 1), 1);  // [C, 1, 1] or [C, 1, 1, 1]
  shape[0] = gamma.size(0);
  return n.mul_(scale).mul_(gamma.reshape(shape));
}

namespace {

// silu(RMS_norm(x)), the SiLU in place on the fresh norm output.
at::Tensor norm_silu(const at::Tensor& x, const parallel::Weight& gamma) {
  at::Tensor h = causal_rms_norm(x, gamma);
  at::silu_(h);
  return h;
}

}  // namespace

at::Tensor residual_frame(const CausalResidualWeights& w, const at::Tensor& x) {
  const at::Tensor shortcut = w.has_shortcut ? causal_conv_frame(x, w.conv_shortcut) : x;
  at::Tensor h = causal_conv_frame(norm_silu(x, w.norm1), w.conv1);
  h = causal_conv_frame(norm_silu(h, w.norm2), w.conv2);
  return h.add_(shortcut);
}

at::Tensor attention_frame(const CausalAttentionWeights& w, const at::Tensor& x, int64_t attention_chunk) {
  const int64_t b = x.size(0), c = x.size(1), hgt = x.size(2), wid = x.size(3);
  const at::Tensor n = causal_rms_norm(x, w.norm);
  at::Tensor qkv = nn::conv2d(n, w.to_qkv.weight.get(), w.to_qkv.bias.get(), 1, 0);  // [B, 3C, H, W]
  // [B, 1, H*W, 3C], then q, k, v are its three channel thirds.
  qkv = qkv.reshape({b, 1, 3 * c, hgt * wid}).permute({0, 1, 3, 2}).contiguous();
  auto parts = qkv.chunk(3, -1);
  at::Tensor attn = nn::sdpa(parts[0], parts[1], parts[2], std::nullopt, std::nullopt, attention_chunk);
  attn = attn.squeeze(1).permute({0, 2, 1}).reshape({b, c, hgt, wid});
  return nn::conv2d(attn, w.proj.weight.get(), w.proj.bias.get(), 1, 0).add_(x);
}

at::Tensor resample_frame(const CausalResampleWeights& w, const at::Tensor& x) {
  if (w.up) {
    // QwenImageUpsample: nearest-exact x2 in fp32, back to the input dtype.
    at::Tensor up = at::_upsample_nearest_exact2d(x.to(at::kFloat), {2 * x.size(2), 2 * x.size(3)}, 2.0, 2.0);
    return nn::conv2d(up.to(x.scalar_type()), w.conv.weight.get(), w.conv.bias.get(), 1, 1);
  }
  const at::Tensor padded = at::constant_pad_nd(x, {0, 1, 0, 1}, 0);
  return nn::conv2d(padded, w.conv.weight.get(), w.conv.bias.get(), 2, 0);
}

at::Tensor mid_block_frame(const CausalMidBlockWeights& w, const at::Tensor& x, int64_t attention_chunk) {
  at::Tensor h = residual_frame(w.resnet0, x);
  h = attention_frame(w.attention, h, attention_chunk);
  return residual_frame(w.resnet1, h);
}

CausalVaeBuild build_causal_vae(const char* cls, checkpoint::WeightSource& source, const CausalVaeLayout& layout,
                                const BuildOptions& build, const ModelOptions& options,
                                const std::string& compute_dtype, CausalConvLoad& conv_load) {
  const int64_t attention_chunk = nn::checked_attention_chunk(options.memory.attention_chunk);
  CausalVaeBuild out;
  out.weights = std::make_shared<CausalVaeWeights>();
  out.built = build_model(cls, source, parallel::TpContext{}, build, [&](ModelBuilder& b) {
    conv_load.bytes_dropped = 0;  // counted in the loading pass only
    *out.weights = declare_causal_vae(layout, b, conv_load);
  });
  out.weights->attention_chunk = attention_chunk;
  nn::log_sdpa_attention(cls, options.device, checkpoint::parse_compute_dtype(compute_dtype, "dtype"), 1,
                         layout.decoder_top(), false, attention_chunk);
  return out;
}

void check_causal_encoder_sides(int64_t height, int64_t width, int64_t downsamplers, const char* what) {
  for (int64_t side : {height, width}) {
    int64_t s = side;
    for (int64_t i = 0; i < downsamplers; ++i, s = (s + 1) / 2) {
      if (s < 2) {
        throw RequestError(fmt::format("input 'image': a side of {} px (of the {} or of one of its tiles) is "
                                       "too small for the encoder's {} downsamplings, each of which needs at "
                                       "least 2 px (give at least {} px per side)",
                                       side, what, downsamplers, (int64_t{1} << (downsamplers - 1)) + 1),
                           true);
      }
    }
  }
}

}  // namespace tprun::models
