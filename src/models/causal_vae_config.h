#pragma once
// What the causal 3-D VAEs' config readers and latent statistics share
// (QwenImageVaeConfig, qwen_image_vae.h; WanVaeConfig, wan_vae.h): the class
// check, bounded list fields, the block fields both read alike (dim_mult,
// temperal_downsample, num_res_blocks, dropout), the per-channel latents_mean
// / latents_std and the pipelines' normalisation with them, the refusal of
// attention inside the encoder's down_blocks, and the Vae facts of a layout.
// Internal to those two classes.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace at {
class Tensor;
}

namespace tprun::models {

class TensorCensus;     // models/model_config.h
struct CausalVaeLayout;  // models/causal_vae_blocks.h
struct VaeInfo;          // models/vae.h

// diffusers' __init__ defaults of the latent statistics (z_dim 16), the same
// in AutoencoderKLQwenImage and AutoencoderKLWan.
const std::vector<double>& wan21_latents_mean();
const std::vector<double>& wan21_latents_std();

// CheckpointError naming `path` unless `c` is a JSON object whose
// _class_name (when given) is `cls`.
void check_vae_class(const nlohmann::json& c, const std::string& path, const char* cls);

// A list of finite numbers (at most 4096); `fallback` when absent or null.
// CheckpointError naming the file and the field otherwise.
std::vector<double> vae_number_list(const nlohmann::json& c, const std::string& field, const std::string& path,
                                    const std::vector<double>& fallback);
// A list of at most 16 booleans; `fallback` when absent or null.
std::vector<bool> vae_bool_list(const nlohmann::json& c, const std::string& field, const std::string& path,
                                const std::vector<bool>& fallback);
// dim_mult: 1 to 16 widths, `fallback` when absent; CheckpointError for an
// empty list or a level of fewer than 2 channels (or more than
// kMaxConfigWidth) for any of `bases` ({field name, width}: each base width
// times each entry, entry by entry, base by base).
std::vector<int64_t> vae_dim_mult(const nlohmann::json& c, const std::string& path,
                                  const std::vector<int64_t>& fallback,
                                  std::initializer_list<std::pair<const char*, int64_t>> bases);
// temperal_downsample (vae_bool_list) of exactly levels - 1 entries.
std::vector<bool> vae_temperal_downsample(const nlohmann::json& c, const std::string& path,
                                          const std::vector<bool>& fallback, size_t levels);
// num_res_blocks in [1, 64]; where `census` holds decoder.up_blocks (a
// checkpoint may hold the encoder alone), checked against its resnets
// (num_res_blocks + 1 per level) and against `levels` up_blocks.
int64_t vae_num_res_blocks(const nlohmann::json& c, const std::string& path, int64_t fallback,
                           const TensorCensus* census, size_t levels);
// dropout in [0, 1) (identity at inference); 0 when absent.
double vae_dropout(const nlohmann::json& c, const std::string& path);
// latents_mean / latents_std: z_dim finite entries (std positive).
std::vector<double> vae_latent_stats(const nlohmann::json& c, const std::string& field, const std::string& path,
                                     const std::vector<double>& fallback, int64_t z_dim, bool positive);
// CheckpointError when an attn_scales entry equals the scale of one of
// `levels` encoder levels (1, 1/2, ...): diffusers' `encoder_class` passes
// the feature cache to every down_blocks entry, which its attention block
// cannot take, so neither does tprun.
void check_vae_attn_scales(const std::vector<double>& attn_scales, size_t levels, const std::string& path,
                           const char* encoder_class);

// `v` as a [1, n, 1, 1, 1] fp32 tensor.
at::Tensor latent_stats_tensor(const std::vector<double>& v);
// The pipelines' latent normalisation for z [B, z_dim, F, h, w] (QwenImage /
// Wan pipelines alike): {mean, 1 / std} in z's dtype on z's device (fp32
// statistics from the config's numbers, cast, the reciprocal taken there).
// RequestError naming 'z' and `cls` for another layout.
std::pair<at::Tensor, at::Tensor> latent_stats_for(const at::Tensor& z, const std::vector<double>& mean,
                                                   const std::vector<double>& std, const char* cls);
// Vae::denormalize / normalize with those: z / (1 / std) + mean and
// (z - mean) x (1 / std).
at::Tensor denormalize_latents(const at::Tensor& z, const std::vector<double>& mean, const std::vector<double>& std,
                               const char* cls);
at::Tensor normalize_latents(const at::Tensor& z, const std::vector<double>& mean, const std::vector<double>& std,
                             const char* cls);

// The Vae facts of a causal VAE `cls` of `layout`: latent channels z_dim,
// spatial scale 2^len(temperal_downsample), frames per latent frame
// `temporal_scale` (1: single frames), decoder channels decoder_base_dim x
// reversed(dim_mult) (lowest resolution first, as the memory estimate counts
// them), sample channels in_channels, tiles of 256 px by default (diffusers'
// tile_sample_min), no upcast, latents with a frame axis.
VaeInfo causal_vae_info(const char* cls, const CausalVaeLayout& layout, int64_t temporal_scale);

}  // namespace tprun::models
