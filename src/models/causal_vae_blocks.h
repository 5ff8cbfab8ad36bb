#pragma once
// Internal to the causal 3-D VAEs (QwenImageVae, qwen_image_vae.h; WanVae,
// wan_vae.h): the weights of diffusers' AutoencoderKLQwenImage /
// AutoencoderKLWan blocks (the Wan 2.1 causal 3-D VAE: both classes hold the
// same modules under the same names), how each is declared, and their
// forwards for ONE frame over NCHW tensors (the time axis of [B, C, 1, H, W]
// dropped). The same blocks over many frames, with diffusers' feature cache
// over time chunks, are in causal_vae_video.h. Not a public API.
//
// Why one frame reduces to 2-D convolutions (the one-frame fast path, which
// QwenImageVae runs). A causal conv pads time
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
// and a one-frame load declares their time_conv weights unused (read by no load).
//
// The one-frame loads keep only the last time tap of each causal conv when the weights
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
//     channels over the H*W positions of each frame, scale 1/sqrt(C); to_qkv
//     and proj are 1x1 Conv2d
//   Resample up: nearest-exact x2 (in fp32, cast back), Conv2d 3x3 pad 1
//     C -> C/2; down: zero pad (0, 1, 0, 1), Conv2d 3x3 stride 2 (per frame;
//     the 3-D modes add a time_conv, causal_vae_video.h)
//   MidBlock: resnets.0, attentions.0, resnets.1

#include <cstdint>
#include <memory>
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

// WanCausalConv3d / QwenImageCausalConv3d: weight [out, in, kt, k, k] (or,
// one-frame loads, its last tap [out, in, k, k]), bias [out]; spatial
// padding (k - 1) / 2; time_pad zeros (or the cached frames) in front of the
// frames, none behind; time stride 1 but the downsampler's time_conv (2).
struct CausalConvWeights {
  parallel::Weight weight, bias;
  int64_t padding = 0;
  int64_t time_pad = 0;
  int64_t time_stride = 1;
};

struct CausalResidualWeights {
  parallel::Weight norm1, norm2;  // gamma [C, 1, 1, 1]
  CausalConvWeights conv1, conv2, conv_shortcut;
  bool has_shortcut = false;
};

struct CausalAttentionWeights {
  parallel::Weight norm;  // gamma [C, 1, 1]
  Affine to_qkv, proj;    // Conv2d 1x1: [3C, C, 1, 1], [C, C, 1, 1]
};

// WanResample / QwenImageResample: up (upsample2d / upsample3d) or down
// (downsample2d / downsample3d); `conv` is resample.1; `time` the 3-D modes,
// whose time_conv (upsample3d: C -> 2C, kernel (3, 1, 1), time pad 2;
// downsample3d: C -> C, kernel (3, 1, 1), stride 2 in time, no pad) is loaded
// only by a many-frame load (`time_conv` defined).
struct CausalResampleWeights {
  bool up = false;
  bool time = false;
  Affine conv;
  CausalConvWeights time_conv;
};

struct CausalMidBlockWeights {
  CausalResidualWeights resnet0, resnet1;
  CausalAttentionWeights attention;
};

// One entry of the encoder's flat down_blocks list: a residual block or a resampler.
struct CausalDownLayer {
  bool is_resample = false;
  CausalResidualWeights resnet;
  CausalResampleWeights resample;
};

struct CausalUpBlockWeights {
  std::vector<CausalResidualWeights> resnets;
  bool has_upsampler = false;
  CausalResampleWeights upsampler;
};

struct CausalEncoderWeights {
  CausalConvWeights conv_in, conv_out;
  std::vector<CausalDownLayer> down;
  CausalMidBlockWeights mid;
  parallel::Weight norm_out;
};

struct CausalDecoderWeights {
  CausalConvWeights conv_in, conv_out;
  CausalMidBlockWeights mid;
  std::vector<CausalUpBlockWeights> up;
  parallel::Weight norm_out;
};

// The layout both classes share (diffusers' __init__): encoder widths
// base_dim x ([1] + dim_mult), decoder widths decoder_base_dim x
// ([dim_mult[-1]] + reversed(dim_mult)), each decoder level after the first
// taking half its predecessor's width; temperal_downsample[i]: encoder level
// i's downsampler is 3-D (the decoder's upsamplers mirror it).
struct CausalVaeLayout {
  int64_t base_dim = 96, decoder_base_dim = 96, z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temperal_downsample = {false, true, true};
  int64_t in_channels = 3, out_channels = 3;
  bool time_convs = false;  // load the resamplers' time_conv (many frames); else declared unused
  int64_t encoder_dim(size_t i) const { return i == 0 ? base_dim : base_dim * dim_mult.at(i - 1); }
  int64_t decoder_top() const { return decoder_base_dim * dim_mult.back(); }
};

struct CausalVaeWeights {
  CausalEncoderWeights encoder;
  CausalDecoderWeights decoder;
  CausalConvWeights quant_conv, post_quant_conv;
  int64_t attention_chunk = 0;  // MemoryOptions::attention_chunk for the mid-block attentions
};

// Declarations, each tensor named and shaped as diffusers' state_dict.
CausalConvWeights declare_causal_conv(ModelBuilder& b, CausalConvLoad& load, const std::string& name, int64_t out,
                                      int64_t in, int64_t kernel);
CausalResidualWeights declare_causal_residual(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                          int64_t in, int64_t out);
CausalAttentionWeights declare_causal_attention(ModelBuilder& b, const std::string& prefix, int64_t channels);
CausalMidBlockWeights declare_causal_mid_block(ModelBuilder& b, CausalConvLoad& load, const std::string& prefix,
                                           int64_t channels);
// `time`: the 3-D mode, with a time_conv: loaded when load_time_conv, else
// declared unused (never run on one frame).
CausalResampleWeights declare_causal_resample(ModelBuilder& b, const std::string& prefix,
                                              int64_t channels, bool up, bool time, bool load_time_conv);
// The whole model in module order: encoder (conv_in, down_blocks, mid_block,
// norm_out, conv_out), quant_conv, post_quant_conv, decoder (conv_in,
// mid_block, up_blocks, norm_out, conv_out). All replicated.
CausalVaeWeights declare_causal_vae(const CausalVaeLayout& layout, ModelBuilder& b, CausalConvLoad& load);

// A causal VAE `cls` of `layout` read from `source` as `build` says
// (build_model over declare_causal_vae, `conv_load` as given, its
// bytes_dropped counted in the loading pass only), the mid-block attentions
// chunked by options.memory.attention_chunk (checked before any byte is
// read) and logged in `compute_dtype` on options.device. The caller finishes
// the load with built's table and bytes (less conv_load.bytes_dropped).
struct CausalVaeBuild {
  std::shared_ptr<CausalVaeWeights> weights;
  BuiltModel built;
};
CausalVaeBuild build_causal_vae(const char* cls, checkpoint::WeightSource& source, const CausalVaeLayout& layout,
                                const BuildOptions& build, const ModelOptions& options,
                                const std::string& compute_dtype, CausalConvLoad& conv_load);

// The encoder's side check: each of its `downsamplers` pads one row / column
// and runs a 3x3 conv at stride 2, which needs 2 px or more (diffusers'
// encoder fails below that as well). RequestError naming input 'image' and
// `what` ("image" / "video": what the side belongs to, or one of its tiles).
void check_causal_encoder_sides(int64_t height, int64_t width, int64_t downsamplers, const char* what);

// Forwards over [B, C, H, W] (the one frame); causal_rms_norm also over
// [B, C, T, H, W].
at::Tensor causal_conv_frame(const at::Tensor& x, const CausalConvWeights& w);
at::Tensor causal_rms_norm(const at::Tensor& x, const parallel::Weight& gamma);
at::Tensor residual_frame(const CausalResidualWeights& w, const at::Tensor& x);
at::Tensor attention_frame(const CausalAttentionWeights& w, const at::Tensor& x, int64_t attention_chunk);
at::Tensor resample_frame(const CausalResampleWeights& w, const at::Tensor& x);
at::Tensor mid_block_frame(const CausalMidBlockWeights& w, const at::Tensor& x, int64_t attention_chunk);

}  // namespace tprun::models
