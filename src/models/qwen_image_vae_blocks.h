#pragma once
// Internal to QwenImageVae (qwen_image_vae.h): the weights of diffusers'
// AutoencoderKLQwenImage blocks (the Wan 2.1 causal 3-D VAE), how each is
// declared, and their forwards for ONE frame, over NCHW tensors (the time
// axis of [B, C, 1, H, W] dropped). Not a public API.
//
// Why one frame reduces to 2-D convolutions. QwenImageCausalConv3d pads time
// by 2*p zeros in front (and nothing behind) unless a cached previous chunk
// stands in for them. diffusers' _decode / _encode run the first chunk (frame
// 0; an image is only that chunk) with an empty feature cache, so the frame
// sees zeros before it: a kernel of kt = 2p + 1 taps then has exactly one
// output frame, and every tap but the last multiplies zeros. The conv is the
// 2-D conv of the frame with weight[:, :, kt - 1] (spatial padding as the
// 3-D conv's: 1 for 3x3x3, 0 for 1x1x1). The time paths of the resamplers
// are not run for the first chunk at all: upsample3d marks its cache slot
// "Rep" and skips time_conv (so the frame count stays 1), downsample3d
// stores the frame and skips its time_conv. Both then equal their 2-D modes,
// and their time_conv weights are declared unused (read by no load).
//
// The loads keep only the last time tap of each causal conv when the weights
// are plainly resident (no offload, no layerwise casting, no device map):
// a third of the 3x3x3 kernels' bytes. Otherwise the 5-D weight is kept as
// stored and the tap is taken at each use.
//
// The blocks (diffusers' names):
//   RMS_norm(x) = x / max(||x||_2 over channels, 1e-12) * sqrt(C) * gamma
//     (gamma [C, 1, 1, 1] in the blocks, [C, 1, 1] in attention; no bias;
//     the normalisation in fp32 for bf16 / fp16 inputs, cast back before the
//     scale and gamma, as diffusers does)
//   ResidualBlock: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))
//     (shortcut: a 1x1x1 causal conv when in != out, else the identity;
//     dropout is the identity at inference)
//   AttentionBlock: x + proj(attn(to_qkv(RMS_norm(x)))): one head of all C
//     channels over the H*W positions, scale 1/sqrt(C); to_qkv and proj are
//     1x1 Conv2d
//   Resample up: nearest-exact x2 (in fp32, cast back), Conv2d 3x3 pad 1
//     C -> C/2; down: zero pad (0, 1, 0, 1), Conv2d 3x3 stride 2
//   MidBlock: resnets.0, attentions.0, resnets.1

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_builder.h"

namespace at {
class Tensor;
}

namespace tprun::models {

// How the loads keep causal conv weights (see the header comment).
struct CausalConvLoad {
  bool last_tap_only = false;  // replace each loaded 5-D weight by its last time tap
  uint64_t bytes_dropped = 0;  // resident bytes saved by doing so
};

// QwenImageCausalConv3d on one frame: weight [out, in, k, k, k] (or its last
// tap [out, in, k, k] once loaded), bias [out]; spatial padding (k - 1) / 2.
struct CausalConvWeights {
  parallel::Weight weight, bias;
  int64_t padding = 0;
};

struct QwenResidualWeights {
  parallel::Weight norm1, norm2;  // gamma [C, 1, 1, 1]
  CausalConvWeights conv1, conv2, conv_shortcut;
  bool has_shortcut = false;
};

struct QwenAttentionWeights {
  parallel::Weight norm;  // gamma [C, 1, 1]
  Affine to_qkv, proj;    // Conv2d 1x1: [3C, C, 1, 1], [C, C, 1, 1]
};

// QwenImageResample: up (upsample2d / upsample3d) or down (downsample2d /
// downsample3d); `conv` is resample.1.
struct QwenResampleWeights {
  bool up = false;
  Affine conv;
};

struct QwenMidBlockWeights {
  QwenResidualWeights resnet0, resnet1;
  QwenAttentionWeights attention;
};

// One entry of the encoder's flat down_blocks list: a residual block or a resampler.
struct QwenDownLayer {
  bool is_resample = false;
  QwenResidualWeights resnet;
  QwenResampleWeights resample;
};

struct QwenUpBlockWeights {
  std::vector<QwenResidualWeights> resnets;
  bool has_upsampler = false;
  QwenResampleWeights upsampler;
};

struct QwenEncoderWeights {
  CausalConvWeights conv_in, conv_out;
  std::vector<QwenDownLayer> down;
  QwenMidBlockWeights mid;
  parallel::Weight norm_out;
};

struct QwenDecoderWeights {
  CausalConvWeights conv_in, conv_out;
  QwenMidBlockWeights mid;
  std::vector<QwenUpBlockWeights> up;
  parallel::Weight norm_out;
};

struct QwenVaeWeights {
  QwenEncoderWeights encoder;
  QwenDecoderWeights decoder;
  CausalConvWeights quant_conv, post_quant_conv;
  int64_t attention_chunk = 0;  // MemoryOptions::attention_chunk for the mid-block attentions
};

// Declarations, each tensor named and shaped as diffusers' state_dict.
CausalConvWeights declare_causal_conv(ModelBuilder& b, CausalConvLoad& load, const std::string& name, int64_t out,
                                      int64_t in, int64_t kernel);
QwenResidualWeights declare_qwen_residual(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                          int64_t in, int64_t out);
QwenAttentionWeights declare_qwen_attention(ModelBuilder& b, const std::string& prefix, int64_t channels);
QwenMidBlockWeights declare_qwen_mid_block(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                           int64_t channels);
// `time`: the 3-D mode (a time_conv, declared unused: never run on one frame).
QwenResampleWeights declare_qwen_resample(ModelBuilder& b, const std::string& prefix, int64_t channels, bool up,
                                          bool time);

// Forwards over [B, C, H, W] (the one frame).
at::Tensor causal_conv_frame(const at::Tensor& x, const CausalConvWeights& w);
at::Tensor qwen_rms_norm(const at::Tensor& x, const parallel::Weight& gamma);
at::Tensor qwen_residual_forward(const QwenResidualWeights& w, const at::Tensor& x);
at::Tensor qwen_attention_forward(const QwenAttentionWeights& w, const at::Tensor& x, int64_t attention_chunk);
at::Tensor qwen_resample_forward(const QwenResampleWeights& w, const at::Tensor& x);
at::Tensor qwen_mid_block_forward(const QwenMidBlockWeights& w, const at::Tensor& x, int64_t attention_chunk);

}  // namespace tprun::models
