// The causal 3-D VAEs' shared config fields and latent statistics.
#include "models/causal_vae_config.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>

#include "checkpoint/safetensors_header.h"
#include "models/model_config.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {
constexpr size_t kMaxLevels = 16;
constexpr size_t kMaxListLength = 4096;
}  // namespace

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

}  // namespace tprun::models
