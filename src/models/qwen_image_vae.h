#pragma once
// diffusers' AutoencoderKLQwenImage (the Wan 2.1 causal 3-D VAE, fine-tuned
// for Qwen-Image) for single-frame images, as the Qwen-Image text-to-image
// pipeline uses it: the decoder (latents -> image) and the encoder (image ->
// latent distribution), replicated (no tensor parallelism: every rank that
// runs it holds the whole VAE, whatever tp is).
//
//   decode: post_quant_conv -> decoder.conv_in -> mid_block (resnet, attention,
//           resnet) -> up_blocks (num_res_blocks + 1 resnets, then nearest-exact
//           x2 + conv to half the channels, but the last) -> norm_out -> SiLU ->
//           conv_out -> clamp to [-1, 1] (diffusers clamps the untiled decode
//           only: a tiled one is returned unclamped, as there)
//   encode: encoder.conv_in -> down_blocks (num_res_blocks resnets per level,
//           then zero pad (0,1,0,1) + conv stride 2, but the last) -> mid_block
//           -> norm_out -> SiLU -> conv_out -> quant_conv = cat(mean, logvar);
//           std = exp(0.5 * clamp(logvar, -30, 20)) (DiagonalGaussianDistribution)
//
// Channels: dims = base_dim x [1] + dim_mult in the encoder; the decoder runs
// base_dim x [dim_mult[-1]] + reversed(dim_mult), each block after the first
// taking half its predecessor's width (the upsampler's conv halves it).
// Every conv of the model is a causal 3-D conv, which on one frame is the 2-D
// conv of its last time tap (qwen_image_vae_blocks.h says why).
//
// Slicing and tiling are diffusers' (enable_slicing / enable_tiling of this
// class, which differ from AutoencoderKL's): tiles of tile_sample_min pixels
// (default 256, or MemoryOptions::vae_tile_sample_size) at a stride of
// tile_sample_stride = int(tile x (1 - vae_tile_overlap)) pixels (default 192);
// latents: both divided (floor) by the spatial compression 2^len(temperal_downsample).
// Decode: latent tiles, blended over tile - stride pixels, cropped to the
// stride; encode: pixel tiles, blended over tile/8 - stride/8 latents,
// cropped to stride/8; the whole cropped to 8h x 8w / H//8 x W//8.
//
// Precision: weights, compute and outputs in the requested dtype (the
// pipeline runs this VAE in its own dtype; there is no force_upcast). The
// RMS norms normalise in fp32 and the upsampler interpolates in fp32, as
// diffusers does.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace at {
class Tensor;
}

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class TensorCensus;  // models/model_config.h

struct QwenImageVaeConfig {
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<double> attn_scales;  // none may name a level (see from_json)
  std::vector<bool> temperal_downsample = {false, true, true};  // [i]: level i's downsampler is 3-D
  double dropout = 0.0;                                          // identity at inference
  int64_t input_channels = 3;
  // The pipeline's latent normalisation, per latent channel: z_dim entries each.
  std::vector<double> latents_mean, latents_std;

  // 2^len(temperal_downsample) (diffusers' spatial_compression_ratio; the
  // pipeline's vae_scale_factor).
  int64_t scale_factor() const { return int64_t{1} << temperal_downsample.size(); }
  // Channels of encoder level i (i in [0, len(dim_mult)]): base_dim x ([1] + dim_mult)[i].
  int64_t encoder_dim(size_t i) const;

  // CheckpointError naming the file and the field for a missing / mistyped /
  // out-of-range field: sizes bounded (base_dim x every dim_mult at most
  // kMaxConfigWidth), num_res_blocks in [1, 64] (and against the checkpoint's
  // decoder blocks with a census), temperal_downsample of len(dim_mult) - 1
  // booleans, dropout in [0, 1), an attn_scales entry equal to a level's scale
  // (1, 1/2, ...: diffusers' encoder cannot run those blocks), latents_mean /
  // latents_std of other than z_dim finite numbers (std > 0), a _class_name
  // other than AutoencoderKLQwenImage. Absent fields take diffusers' __init__
  // defaults.
  static QwenImageVaeConfig from_json(const nlohmann::json& config, const std::string& config_path,
                                      const TensorCensus* census = nullptr);
};

struct QwenVaeWeights;  // qwen_image_vae_blocks.h

class QwenImageVae final : public Model {
 public:
  static constexpr const char* kClass = "AutoencoderKLQwenImage";

  // Every state_dict tensor in module order (encoder, quant_conv,
  // post_quant_conv, decoder), all replicated; the resamplers' time_conv
  // tensors are optional (never run on one frame); with options.part the
  // other half's tensors are optional, as that load never reads them.
  static ModelTable table_for(const QwenImageVaeConfig& config, const ModelOptions& options = {});

  // Validates the requested part (ModelOptions::part: "decoder" = decoder.* +
  // post_quant_conv, "encoder" = encoder.* + quant_conv, "" = both) against
  // the source's headers before any weight byte is read, then reads it whole
  // on every rank that loads it (`tp` is not used). ConfigError for tiles
  // smaller than the scale factor or an overlap that leaves a latent stride of 0.
  static std::unique_ptr<QwenImageVae> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                            const std::string& config_path, const parallel::TpContext& tp = {},
                                            const ModelOptions& options = {});

  // z [B, z_dim, 1, h, w] or [B, z_dim, h, w], as the pipeline hands it (already
  // z * latents_std + latents_mean) -> sample [B, input_channels, 1, h*sf, w*sf]
  // (sf = scale_factor()), in compute_dtype(). RequestError naming 'z' for
  // another rank, channel count or more than one frame; ConfigError when loaded
  // without the decoder.
  at::Tensor decode(const at::Tensor& z, Trace* trace = nullptr) const;

  // image [B, input_channels, 1, H, W] or [B, input_channels, H, W] in [-1, 1]
  // -> {"mean", "std"} of the latent distribution, each [B, z_dim, 1, h, w]
  // (h = H halved, rounding up, at each level; tiled: H // sf as diffusers
  // crops it). RequestError naming 'image' as decode's; ConfigError when
  // loaded without the encoder.
  TensorMap encode(const at::Tensor& image, Trace* trace = nullptr) const;

  // {"latents"} -> {"sample"} (decode) or {"image"} -> {"mean", "std"} (encode).
  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const override;
  TensorMap example_inputs(uint64_t seed) const override;
  std::string primary_output() const override;

  const QwenImageVaeConfig& config() const { return config_; }
  // config().latents_mean / latents_std as [1, z_dim, 1, 1, 1] fp32 tensors:
  // the pipeline decodes z * std + mean (and encodes (z - mean) / std).
  at::Tensor latents_mean() const;
  at::Tensor latents_std() const;
  const std::string& compute_dtype() const { return compute_dtype_; }
  bool has_decoder() const;
  bool has_encoder() const;
  // MemoryOptions::vae_slicing / vae_tiling as loaded; tile and stride in pixels.
  bool slicing() const { return slicing_; }
  bool tiling() const { return tiling_; }
  int64_t tile_sample_size() const { return tile_sample_; }
  int64_t tile_sample_stride() const { return tile_stride_; }

 private:
  // One image batch without slicing or tiling (4-D in and out): the decoded
  // frame (unclamped) and the [mean, logvar] moments.
  at::Tensor decode_frame(const at::Tensor& z, Trace* trace) const;
  at::Tensor encode_moments(const at::Tensor& image, Trace* trace) const;

  QwenImageVaeConfig config_;
  bool slicing_ = false, tiling_ = false;
  int64_t tile_sample_ = 256, tile_stride_ = 192;
  std::string compute_dtype_ = "fp32";
  std::shared_ptr<const QwenVaeWeights> w_;
};

}  // namespace tprun::models
