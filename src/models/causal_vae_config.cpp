// The causal 3-D VAEs' shared config fields and latent statistics.
#include "models/causal_vae_config.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>

#include "checkpoint/safetensors_header.h"
#include "models/causal_vae_blocks.h"
#include "models/model_config.h"
#include "models/vae.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {
constexpr size_t kMaxLevels = 16;
constexpr size_t kMaxListLength = 4096;
constexpr int64_t kDefaultTile = 256;  // diffusers' tile_sample_min_height / _width (px)
}  // namespace

void check_vae_class(const nlohmann::json& c, const std::string& path, const char* cls) {
  if (!c.is_object()) throw CheckpointError(fmt::format("{}: config must be a JSON object", path));
  const std::string given = config_class(c);
  if (!given.empty() && given != cls) {
    throw CheckpointError(fmt::format("{}: _class_name '{}' is not {}", path, clip_text(given), cls));
  }
}

const std::vector<double>& wan21_latents_mean() {
  static const std::vector<double> v = {-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                                        0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503, -0.2921};
  return v;
}

const std::vector<double>& wan21_latents_std() {
  static const std::vector<double> v = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                        3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};
  return v;
}

std::vector<double> vae_number_list(const nlohmann::json& c, const std::string& field, const std::string& path,
                                    const std::vector<double>& fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  const auto& v = c[field];
  if (!v.is_array() || v.size() > kMaxListLength) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a list of at most {} numbers", path, field,
                                      kMaxListLength));
  }
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number() || !std::isfinite(e.get<double>())) {
      throw CheckpointError(fmt::format("{}: field '{}' holds {}, not a finite number", path, field,
                                        clip_text(e.dump())));
    }
    out.push_back(e.get<double>());
  }
  return out;
}

std::vector<bool> vae_bool_list(const nlohmann::json& c, const std::string& field, const std::string& path,
                                const std::vector<bool>& fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  const auto& v = c[field];
  if (!v.is_array() || v.size() > kMaxLevels) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a list of at most {} booleans", path, field,
                                      kMaxLevels));
  }
  std::vector<bool> out;
  for (const auto& e : v) {
    if (!e.is_boolean()) {
      throw CheckpointError(fmt::format("{}: field '{}' holds {}, not a boolean", path, field, clip_text(e.dump())));
    }
    out.push_back(e.get<bool>());
  }
  return out;
}

std::vector<int64_t> vae_dim_mult(const nlohmann::json& c, const std::string& path,
                                  const std::vector<int64_t>& fallback,
                                  std::initializer_list<std::pair<const char*, int64_t>> bases) {
  std::vector<int64_t> dim_mult = config_int_list_or(c, "dim_mult", path, fallback, kMaxLevels, kMaxConfigWidth);
  if (dim_mult.empty()) throw CheckpointError(fmt::format("{}: field 'dim_mult' must not be empty", path));
  for (int64_t m : dim_mult) {
    for (const auto& [field, base] : bases) {
      const int64_t ch = config_product(path, {{field, base}, {"dim_mult entry", m}}, kMaxConfigWidth);
      if (ch < 2) {
        throw CheckpointError(fmt::format("{}: {} {} x dim_mult entry {} = {} channels; the decoder's upsamplers "
                                          "halve a level's channels, so each level needs at least 2",
                                          path, field, base, m, ch));
      }
    }
  }
  return dim_mult;
}

std::vector<bool> vae_temperal_downsample(const nlohmann::json& c, const std::string& path,
                                          const std::vector<bool>& fallback, size_t levels) {
  std::vector<bool> v = vae_bool_list(c, "temperal_downsample", path, fallback);
  if (v.size() != levels - 1) {
    throw CheckpointError(fmt::format("{}: field 'temperal_downsample' has {} entries but dim_mult has {} levels "
                                      "(one entry per downsampling: {})",
                                      path, v.size(), levels, levels - 1));
  }
  return v;
}

int64_t vae_num_res_blocks(const nlohmann::json& c, const std::string& path, int64_t fallback,
                           const TensorCensus* census, size_t levels) {
  // The decoder holds num_res_blocks + 1 resnets per level (a checkpoint may hold the encoder alone).
  const bool census_decoder = census != nullptr && census->blocks("decoder.up_blocks") > 0;
  const int64_t n = config_block_count(c, "num_res_blocks", path, fallback, census_decoder ? census : nullptr,
                                       {"decoder.up_blocks.0.resnets"}, 1, 1, 64);
  if (census_decoder && census->blocks("decoder.up_blocks") < static_cast<int64_t>(levels)) {
    throw CheckpointError(fmt::format("{}: field 'dim_mult' lists {} levels but {} holds {} 'decoder.up_blocks.<i>'",
                                      path, levels, census->source(), census->blocks("decoder.up_blocks")));
  }
  return n;
}

double vae_dropout(const nlohmann::json& c, const std::string& path) {
  const double dropout = config_number_or(c, "dropout", path, 0.0);
  if (!(dropout >= 0 && dropout < 1)) {
    throw CheckpointError(fmt::format("{}: field 'dropout' = {} must be in [0, 1)", path, dropout));
  }
  return dropout;
}

std::vector<double> vae_latent_stats(const nlohmann::json& c, const std::string& field, const std::string& path,
                                     const std::vector<double>& fallback, int64_t z_dim, bool positive) {
  const bool given = c.contains(field) && !c[field].is_null();
  std::vector<double> v = vae_number_list(c, field, path, fallback);
  if (static_cast<int64_t>(v.size()) != z_dim) {
    throw CheckpointError(fmt::format("{}: field '{}' has {} entries but z_dim is {}{}", path, field, v.size(),
                                      z_dim, given ? "" : " (absent: diffusers' default has 16)"));
  }
  for (double x : v) {
    if (positive && !(x > 0)) {
      throw CheckpointError(fmt::format("{}: field '{}' holds {}; every entry must be positive", path, field, x));
    }
  }
  return v;
}

void check_vae_attn_scales(const std::vector<double>& attn_scales, size_t levels, const std::string& path,
                           const char* encoder_class) {
  for (double s : attn_scales) {
    for (size_t i = 0; i < levels; ++i) {
      if (s == std::ldexp(1.0, -static_cast<int>(i))) {
        throw CheckpointError(fmt::format("{}: field 'attn_scales' holds {}, the scale of encoder level {}: "
                                          "diffusers' {} cannot run attention blocks inside "
                                          "down_blocks (its forward passes them the feature cache), so neither "
                                          "does tprun; use []",
                                          path, s, i, encoder_class));
      }
    }
  }
}

at::Tensor latent_stats_tensor(const std::vector<double>& v) {
  std::vector<double> copy = v;
  const auto n = static_cast<int64_t>(copy.size());
  const at::Tensor t = at::from_blob(copy.data(), {n}, at::TensorOptions().dtype(at::kDouble));
  return t.to(at::kFloat).reshape({1, n, 1, 1, 1});  // a copy: `copy` dies here
}

std::pair<at::Tensor, at::Tensor> latent_stats_for(const at::Tensor& z, const std::vector<double>& mean,
                                                   const std::vector<double>& std, const char* cls) {
  const auto z_dim = static_cast<int64_t>(mean.size());
  if (!z.defined() || z.dim() != 5 || z.size(1) != z_dim) {
    throw RequestError(fmt::format("{}: latents 'z' must be [B, {}, F, h, w], got {}", cls, z_dim,
                                   z.defined() ? checkpoint::shape_string(z.sizes().vec()) : "none"),
                       true);
  }
  const at::Tensor inv_std = 1.0 / latent_stats_tensor(std).to(z.device(), z.scalar_type());
  return {latent_stats_tensor(mean).to(z.device(), z.scalar_type()), inv_std};
}

at::Tensor denormalize_latents(const at::Tensor& z, const std::vector<double>& mean, const std::vector<double>& std,
                               const char* cls) {
  const auto [m, inv_std] = latent_stats_for(z, mean, std, cls);
  return z / inv_std + m;
}

at::Tensor normalize_latents(const at::Tensor& z, const std::vector<double>& mean, const std::vector<double>& std,
                             const char* cls) {
  const auto [m, inv_std] = latent_stats_for(z, mean, std, cls);
  return (z - m) * inv_std;
}

VaeInfo causal_vae_info(const char* cls, const CausalVaeLayout& layout, int64_t temporal_scale) {
  VaeInfo info;
  info.cls = cls;
  info.latent_channels = layout.z_dim;
  info.spatial_scale = int64_t{1} << layout.temperal_downsample.size();
  info.temporal_scale = temporal_scale;
  info.default_tile_sample = kDefaultTile;
  for (auto it = layout.dim_mult.rbegin(); it != layout.dim_mult.rend(); ++it) {
    info.decoder_channels.push_back(layout.decoder_base_dim * *it);
  }
  info.sample_channels = layout.in_channels;
  info.frame_axis = true;
  return info;
}

}  // namespace tprun::models
