#pragma once
// diffusers' AutoencoderKL as FLUX.1 uses it (16 latent channels, no quant
// convs, one single-head attention in each mid-block) and AutoencoderKLFlux2
// (FLUX.2: 32 latent channels, quant / post-quant convs, an optional decoder
// width, and the BatchNorm2d statistics `bn.running_mean/var` of the
// 2x2-patchified latents, which only the latent normalisation uses): the
// decoder (latents -> image) and the encoder (image -> latent distribution),
// replicated (no tensor parallelism: every rank that runs it
// holds the whole VAE). One implementation, registered for both class names.
//
//   decode: [post_quant_conv] -> decoder.conv_in -> mid_block (resnet, attn,
//           resnet) -> up_blocks (resnets, nearest x2 + conv) ->
//           conv_norm_out -> SiLU -> conv_out
//   encode: encoder.conv_in -> down_blocks (resnets, pad (0,1,0,1) + conv
//           stride 2) -> mid_block -> conv_norm_out -> SiLU -> conv_out
//           [-> quant_conv] = moments = cat(mean, logvar);
//           std = exp(0.5 * clamp(logvar, -30, 20))
//
// Precision: with a half compute dtype (bf16 / fp16) and force_upcast true in
// config.json, the VAE is upcast to fp32 as diffusers' pipelines do: weights
// are loaded and kept in fp32 and decode / encode compute and return fp32.
// Otherwise weights, compute and outputs are in the requested dtype.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/vae.h"

namespace tprun::models {

struct VaeConfig {
  std::string cls = "AutoencoderKL";  // or "AutoencoderKLFlux2" (flux2 below)
  bool flux2 = false;
  int64_t in_channels = 3, out_channels = 3;
  std::vector<int64_t> block_out_channels = {64};  // encoder order (the decoder reverses it)
  std::vector<int64_t> decoder_block_out_channels;  // AutoencoderKLFlux2's option; = block_out_channels otherwise
  double batch_norm_eps = 1e-4;                     // AutoencoderKLFlux2: the latent batch-norm's eps
  int64_t layers_per_block = 1;
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  bool use_quant_conv = true, use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;  // 0 when config.json has null
  bool has_shift = false;     // shift_factor was a number
  bool force_upcast = true;
  // Tile side in pixels for tiled decode / encode (an int, or a list whose
  // first entry is taken, as diffusers does).
  int64_t sample_size = 32;

  // 2^(len(block_out_channels)-1): FluxPipeline's vae_scale_factor.
  int64_t scale_factor() const;

  // CheckpointError naming the file and field for a missing / mistyped field,
  // non-positive sizes, channels not divisible by norm_num_groups, block type
  // lists that are not all DownEncoderBlock2D / UpDecoderBlock2D of
  // len(block_out_channels), or an act_fn other than silu. Absent optional
  // fields take diffusers' __init__ defaults (AutoencoderKLFlux2's when
  // _class_name says so).
  static VaeConfig from_json(const nlohmann::json& config, const std::string& config_path,
                             const TensorCensus* census = nullptr);
};

struct VaeWeights;  // vae_blocks.h

class AutoencoderKL final : public Vae {
 public:
  static constexpr const char* kClass = "AutoencoderKL";

  // The table: every state_dict tensor in module order, all replicated (the
  // VAE has no TP plan); with options.part the other half's tensors are
  // optional, as that load never reads them.
  static ModelTable table_for(const VaeConfig& config, const ModelOptions& options = {});

  // Validates the tensors of the requested part (ModelOptions::part:
  // "decoder" = decoder.* + post_quant_conv, "encoder" = encoder.* +
  // quant_conv, "" = both) against the source's headers before any weight
  // byte is read (CheckpointError naming the tensor and both shapes), then
  // reads them (whole on every rank that loads it: `tp` is not used).
  static std::unique_ptr<AutoencoderKL> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                             const std::string& config_path, const parallel::TpContext& tp = {},
                                             const ModelOptions& options = {});

  // AutoencoderKL: z [B, latent_channels, h, w]; denormalize = z /
  // scaling_factor + shift_factor, normalize = (z - shift_factor) x
  // scaling_factor (FluxPipeline / FluxImg2ImgPipeline). AutoencoderKLFlux2:
  // the patchified z [B, 4 x latent_channels, h/2, w/2]; denormalize = z x
  // bn_std + bn_mean, normalize = (z - bn_mean) / bn_std (Flux2Pipeline), the
  // statistics in z's dtype on z's device. RequestError naming 'z' otherwise.
  at::Tensor denormalize(const at::Tensor& z) const override;
  at::Tensor normalize(const at::Tensor& z) const override;

  const VaeConfig& config() const { return config_; }
  bool upcast() const { return upcast_; }
  // AutoencoderKLFlux2: bn.running_mean and sqrt(bn.running_var + batch_norm_eps),
  // [4 * latent_channels], in the VAE's dtype on its device. Internal error otherwise.
  at::Tensor latent_bn_mean() const;
  at::Tensor latent_bn_std() const;
  // The tile side in latents.
  int64_t tile_latent_size() const { return tile_sample_size() / config_.scale_factor(); }

 private:
  // An AutoencoderKL of `config` whose weights load() reads next.
  AutoencoderKL(VaeConfig config, const ModelOptions& options);
  // Vae::decode / encode of z [b, latent_channels, h, w] -> [b, out_channels,
  // h*sf, w*sf] (sf = scale_factor()) and image [b, in_channels, H, W] ->
  // moments [b, 2 x latent_channels, H/sf, W/sf] (each halving floors), tiled
  // as diffusers' AutoencoderKL.enable_tiling (models/vae_tiling.h).
  at::Tensor decode_images(const at::Tensor& z, Trace* trace) const override;
  at::Tensor encode_images(const at::Tensor& image, Trace* trace) const override;
  // One decode / encode without tiling; encode_moments is the
  // (quant_conv'd) [mean, logvar] the tiles are blended on.
  at::Tensor decode_plain(const at::Tensor& z, Trace* trace) const;
  at::Tensor encode_moments(const at::Tensor& image, Trace* trace) const;
  // z's denormalize / normalize statistics in z's dtype on z's device
  // (AutoencoderKLFlux2: {std, mean} as [1, 4C, 1, 1]); RequestError naming 'z'
  // for a z of another layout.
  std::pair<at::Tensor, at::Tensor> bn_stats_for(const at::Tensor& z) const;

  VaeConfig config_;
  bool upcast_ = false;
  std::shared_ptr<const VaeWeights> w_;
};

}  // namespace tprun::models
