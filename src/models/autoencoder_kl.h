#pragma once
// diffusers' AutoencoderKL as FLUX.1 uses it (16 latent channels, no quant
// convs, one single-head attention in each mid-block) and AutoencoderKLFlux2
// (FLUX.2: 32 latent channels, quant / post-quant convs, an optional decoder
// width, and the BatchNorm2d statistics `bn.running_mean/var` of the
// 2x2-patchified latents, which the pipelines use and the VAE itself does
// not): the decoder (latents -> image) and the encoder (image -> latent
// distribution), replicated (no tensor parallelism: every rank that runs it
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

class AutoencoderKL final : public Model {
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

  // z [B, latent_channels, h, w], already un-scaled (the caller did
  // z / scaling_factor + shift_factor) -> sample [B, out_channels, h*sf, w*sf]
  // (sf = scale_factor()), not clamped, in compute_dtype(). z may be on any
  // device / dtype; it is moved to the VAE's. RequestError naming 'z' and the
  // expected shape for a wrong rank or channel count; ConfigError when loaded
  // without the decoder.
  at::Tensor decode(const at::Tensor& z, Trace* trace = nullptr) const;

  // image [B, in_channels, H, W] in [-1, 1] -> {"mean", "std"} of the latent
  // distribution, each [B, latent_channels, H/sf, W/sf] (each halving floors), in
  // compute_dtype(). RequestError naming 'image' for a wrong rank or channel
  // count; ConfigError when loaded without the encoder.
  TensorMap encode(const at::Tensor& image, Trace* trace = nullptr) const;

  // {"latents"} -> {"sample"} (decode) or {"image"} -> {"mean", "std"} (encode).
  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const override;
  TensorMap example_inputs(uint64_t seed) const override;
  std::string primary_output() const override;

  const VaeConfig& config() const { return config_; }
  // "fp32" when upcast (force_upcast with a half dtype), else the requested dtype.
  const std::string& compute_dtype() const { return compute_dtype_; }
  bool upcast() const { return upcast_; }
  bool has_decoder() const;
  bool has_encoder() const;
  // AutoencoderKLFlux2: bn.running_mean and sqrt(bn.running_var + batch_norm_eps),
  // [4 * latent_channels] (the pipelines' latent normalisation). Internal error otherwise.
  at::Tensor latent_bn_mean() const;
  at::Tensor latent_bn_std() const;
  // MemoryOptions::vae_slicing / vae_tiling as loaded; tile sides (pixels, latents).
  bool slicing() const { return slicing_; }
  bool tiling() const { return tiling_; }
  int64_t tile_sample_size() const { return tile_sample_; }
  int64_t tile_latent_size() const { return tile_sample_ / config_.scale_factor(); }

 private:
  // One decode / encode without slicing or tiling; encode_moments is the
  // (quant_conv'd) [mean, logvar] the tiles are blended on.
  at::Tensor decode_plain(const at::Tensor& z, Trace* trace) const;
  at::Tensor encode_moments(const at::Tensor& image, Trace* trace) const;

  VaeConfig config_;
  bool slicing_ = false, tiling_ = false;
  int64_t tile_sample_ = 0;
  double tile_overlap_ = 0.25;
  std::string compute_dtype_ = "fp32";
  bool upcast_ = false;
  std::shared_ptr<const VaeWeights> w_;
};

}  // namespace tprun::models
