#pragma once
// What the causal 3-D VAEs' config readers and latent statistics share
// (QwenImageVaeConfig, qwen_image_vae.h; WanVaeConfig, wan_vae.h): bounded
// list fields, the per-channel latents_mean / latents_std and the pipelines'
// normalisation with them, and the refusal of attention inside the encoder's
// down_blocks. Internal to those two classes.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace at {
class Tensor;
}

namespace tprun::models {

// diffusers' __init__ defaults of the latent statistics (z_dim 16), the same
// in AutoencoderKLQwenImage and AutoencoderKLWan.
const std::vector<double>& wan21_latents_mean();
const std::vector<double>& wan21_latents_std();

// A list of finite numbers (at most 4096); `fallback` when absent or null.
// CheckpointError naming the file and the field otherwise.
std::vector<double> vae_number_list(const nlohmann::json& c, const std::string& field, const std::string& path,
                                    const std::vector<double>& fallback);
// A list of at most 16 booleans; `fallback` when absent or null.
std::vector<bool> vae_bool_list(const nlohmann::json& c, const std::string& field, const std::string& path,
                                const std::vector<bool>& fallback);
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

}  // namespace tprun::models
