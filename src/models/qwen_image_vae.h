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
// conv of its last time tap (causal_vae_blocks.h says why).
//
// Slicing and tiling are diffusers' (enable_slicing / enable_tiling of this
// class, which differ from AutoencoderKL's; causal_vae_tiling.h): tiles of tile_sample_min pixels
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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/causal_vae_tiling.h"
#include "models/vae.h"

namespace tprun::models {

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

struct CausalVaeWeights;  // causal_vae_blocks.h

class QwenImageVae final : public Vae {
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

  // z [B, z_dim, F, h, w]: denormalize = z / (1 / latents_std) + latents_mean,
  // normalize = (z - latents_mean) x (1 / latents_std), as QwenImagePipeline /
  // QwenImageImg2ImgPipeline; the statistics (fp32 from the config's numbers)
  // and 1 / std in z's dtype on z's device. RequestError naming 'z' otherwise.
  at::Tensor denormalize(const at::Tensor& z) const override;
  at::Tensor normalize(const at::Tensor& z) const override;

  // Vae::tiled_decode: the latent grid of decode_images (below), each tile
  // decoded alone, the whole cropped to 8h x 8w, unclamped (as diffusers'
  // tiled decode), with the frame axis put back.
  std::optional<TiledDecode> tiled_decode(const at::Tensor& z) const override;

  const QwenImageVaeConfig& config() const { return config_; }
  // config().latents_mean / latents_std as [1, z_dim, 1, 1, 1] fp32 tensors.
  at::Tensor latents_mean() const;
  at::Tensor latents_std() const;
  // The tile stride in pixels: int(tile_sample_size() x (1 - vae_tile_overlap)).
  int64_t tile_sample_stride() const { return tiles_.stride; }

 private:
  // A QwenImageVae of `config` whose weights load() reads next; ConfigError for its tiles.
  QwenImageVae(QwenImageVaeConfig config, const ModelOptions& options, const std::string& config_path);
  // Vae::decode / encode of one frame: z [b, z_dim, h, w] -> [b,
  // input_channels, h*sf, w*sf] (sf = scale_factor()), clamped to [-1, 1]
  // unless tiled (as diffusers); image [b, input_channels, H, W] -> moments
  // [b, 2 x z_dim, h, w] (h = H halved, rounding up, at each level; tiled:
  // H // sf as diffusers crops it). Tiles as the header comment says.
  at::Tensor decode_images(const at::Tensor& z, Trace* trace) const override;
  // The tiled decode of a checked [b, z_dim, h, w] (nullopt when not tiled).
  std::optional<TiledDecode> tiles_of(const at::Tensor& z) const;
  at::Tensor encode_images(const at::Tensor& image, Trace* trace) const override;
  // One image batch without tiling (4-D in and out): the decoded frame
  // (unclamped) and the [mean, logvar] moments.
  at::Tensor decode_frame(const at::Tensor& z, Trace* trace) const;
  at::Tensor encode_moments(const at::Tensor& image, Trace* trace) const;

  QwenImageVaeConfig config_;
  CausalVaeTiling tiles_;
  std::shared_ptr<const CausalVaeWeights> w_;
};

}  // namespace tprun::models
