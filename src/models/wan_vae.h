#pragma once
// diffusers' AutoencoderKLWan (the Wan 2.1 causal 3-D video VAE, as Wan 2.1
// and Wan 2.2 A14B ship it) on many frames: the decoder (latents -> video)
// and the encoder (video -> latent distribution), replicated (no tensor
// parallelism: every rank that runs it holds the whole VAE; a decode can be
// spread over the TP group with decode_across_group, vae_split_decode.h).
// Its blocks are AutoencoderKLQwenImage's (causal_vae_blocks.h), run over
// time chunks with diffusers' feature cache (causal_vae_video.h):
//
//   decode: z [B, z_dim, F, h, w] -> post_quant_conv -> the decoder one
//           latent frame at a time (frame 0 -> 1 frame, each later one -> 4)
//           -> [B, out_channels, 1 + 4 (F - 1), 8h, 8w], clamped to [-1, 1]
//           (clip_output, default true; diffusers 0.40 always clamps,
//           tiled or not)
//   encode: x [B, in_channels, 1 + 4k, H, W] -> the encoder on frame 0, then
//           on each chunk of 4 frames -> quant_conv = cat(mean, logvar)
//           [B, 2 z_dim, 1 + k, h, w]; std = exp(0.5 clamp(logvar, -30, 20))
//
// Slicing and tiling are diffusers' enable_slicing / enable_tiling of this
// class (the tiles: causal_vae_tiling.h, shared with QwenImageVae): slicing decodes / encodes the batch one video at a time; tiles are
// spatial and span every frame of the video (each tile its own feature
// cache), tile_sample_min 256 px (or MemoryOptions::vae_tile_sample_size) at
// a stride of int(tile x (1 - vae_tile_overlap)) px (192 by default), the
// latent tile and stride those divided (floor) by scale_factor_spatial;
// decode blends over tile - stride pixels and crops to the stride, encode
// over tile/8 - stride/8 latents and crops to stride/8; the whole is cropped
// to 8h x 8w / H//8 x W//8 (and the decode clamped).
//
// Precision: weights, compute and outputs in the requested dtype (no
// force_upcast; the RMS norms normalise in fp32 and the upsamplers
// interpolate in fp32, as diffusers). Wan 2.2 TI2V-5B's VAE (is_residual,
// patch_size 2, z_dim 48) is refused by name.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/causal_vae_tiling.h"
#include "models/vae.h"

namespace tprun::models {

struct CausalVaeLayout;  // causal_vae_blocks.h

struct WanVaeConfig {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 96;  // null / absent: base_dim
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<double> attn_scales;
  std::vector<bool> temperal_downsample = {false, true, true};
  double dropout = 0.0;  // identity at inference
  std::vector<double> latents_mean, latents_std;  // z_dim entries each
  bool is_residual = false;  // refused (Wan 2.2 TI2V-5B)
  int64_t in_channels = 3, out_channels = 3;
  int64_t patch_size = 1;  // null / absent: 1 (no patchify); others refused
  int64_t scale_factor_temporal = 4;
  int64_t scale_factor_spatial = 8;
  bool clip_output = true;

  // The blocks' layout (encoder widths base_dim x ([1] + dim_mult), decoder
  // decoder_base_dim x ([dim_mult[-1]] + reversed(dim_mult)); time_convs loaded).
  CausalVaeLayout layout() const;

  // CheckpointError naming the file and the field for a missing / mistyped /
  // out-of-range field: widths bounded (base_dim / decoder_base_dim x every
  // dim_mult at most kMaxConfigWidth and at least 2), z_dim in [1, 4096],
  // in_channels / out_channels in [1, 64], num_res_blocks in [1, 64] (and
  // against the checkpoint's decoder blocks with a census),
  // temperal_downsample of len(dim_mult) - 1 booleans with exactly two true
  // (4x in time), scale_factor_temporal 4 and scale_factor_spatial
  // 2^(len(dim_mult) - 1) (what the blocks do), dropout in [0, 1), an
  // attn_scales entry equal to a level's scale, latents_mean / latents_std of
  // other than z_dim finite numbers (std > 0), is_residual true or a
  // patch_size other than null / 1 (Wan 2.2 TI2V-5B's VAE, named), a
  // _class_name other than AutoencoderKLWan. Absent fields take diffusers'
  // __init__ defaults.
  static WanVaeConfig from_json(const nlohmann::json& config, const std::string& config_path,
                                const TensorCensus* census = nullptr);
};

struct CausalVaeWeights;  // causal_vae_blocks.h

class WanVae final : public Vae {
 public:
  static constexpr const char* kClass = "AutoencoderKLWan";

  // Every state_dict tensor in module order (encoder, quant_conv,
  // post_quant_conv, decoder), all replicated, the time_convs included; with
  // options.part the other half's tensors are optional.
  static ModelTable table_for(const WanVaeConfig& config, const ModelOptions& options = {});

  // Validates the requested part against the source's headers before any
  // weight byte is read, then reads it whole on every rank that loads it
  // (`tp` is not used). ConfigError for tiles smaller than the scale factor
  // or an overlap that leaves a latent stride of 0.
  static std::unique_ptr<WanVae> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                      const std::string& config_path, const parallel::TpContext& tp = {},
                                      const ModelOptions& options = {});

  // z [B, z_dim, F, h, w]: denormalize = z / (1 / latents_std) + latents_mean,
  // normalize = (z - latents_mean) x (1 / latents_std), as WanPipeline; the
  // statistics (fp32 from the config's numbers) and 1 / std in z's dtype on
  // z's device. RequestError naming 'z' otherwise.
  at::Tensor denormalize(const at::Tensor& z) const override;
  at::Tensor normalize(const at::Tensor& z) const override;

  // Vae::tiled_decode: the latent grid (tile_sample_size() / sf at a stride
  // of tile_sample_stride() / sf, blended over tile - stride px, cropped to
  // the stride), each tile decoded over all its frames, the whole cropped to
  // 8h x 8w and clamped (clip_output).
  std::optional<TiledDecode> tiled_decode(const at::Tensor& z) const override;

  const WanVaeConfig& config() const { return config_; }
  // The tile stride in pixels: int(tile_sample_size() x (1 - vae_tile_overlap)).
  int64_t tile_sample_stride() const { return tiles_.stride; }

 private:
  WanVae(WanVaeConfig config, const ModelOptions& options, const std::string& config_path);
  // Vae::decode_videos / encode_videos (checked 5-D slices); the untiled
  // paths are causal_decode_video / causal_encode_video.
  at::Tensor decode_videos(const at::Tensor& z, Trace* trace) const override;
  at::Tensor encode_videos(const at::Tensor& image, Trace* trace) const override;
  // Never called: decode / encode route a video VAE to the *_videos paths.
  at::Tensor decode_images(const at::Tensor& z, Trace* trace) const override;
  at::Tensor encode_images(const at::Tensor& image, Trace* trace) const override;
  // x on the weights' device and dtype.
  at::Tensor to_weights(const at::Tensor& x) const;
  // The untiled encode of one video slice, its sides checked against the downsamplers.
  at::Tensor encode_untiled(const at::Tensor& x, Trace* trace) const;

  WanVaeConfig config_;
  CausalVaeTiling tiles_;
  std::shared_ptr<const CausalVaeWeights> w_;
};

}  // namespace tprun::models
