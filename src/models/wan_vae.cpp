// AutoencoderKLWan: config, the table of its tensors, loading, and the
// many-frame decode / encode with diffusers' slicing and tiling.
#include "models/wan_vae.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/clamp.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/causal_vae_blocks.h"
#include "models/causal_vae_config.h"
#include "models/causal_vae_tiling.h"
#include "models/causal_vae_video.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/vae_tiling.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

// An optional positive integer field whose null means "absent" (diffusers'
// `int | None`): `fallback` then.
int64_t positive_or_null(const nlohmann::json& c, const std::string& field, const std::string& path,
                         int64_t fallback, int64_t max) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  return config_positive(c, field, path, fallback, max);
}

}  // namespace

CausalVaeLayout WanVaeConfig::layout() const {
  CausalVaeLayout l;
  l.base_dim = base_dim;
  l.decoder_base_dim = decoder_base_dim;
  l.z_dim = z_dim;
  l.dim_mult = dim_mult;
  l.num_res_blocks = num_res_blocks;
  l.temperal_downsample = temperal_downsample;
  l.in_channels = in_channels;
  l.out_channels = out_channels;
  l.time_convs = true;
  return l;
}

WanVaeConfig WanVaeConfig::from_json(const nlohmann::json& c, const std::string& path, const TensorCensus* census) {
  check_vae_class(c, path, WanVae::kClass);
  WanVaeConfig v;
  // Wan 2.2 TI2V-5B's VAE first: a residual, patchified VAE (z_dim 48) tprun does not run yet.
  v.is_residual = config_bool_or(c, "is_residual", path, false);
  if (v.is_residual) {
    throw CheckpointError(fmt::format("{}: field 'is_residual' is true: Wan 2.2 TI2V-5B's residual VAE (residual "
                                      "down / up blocks, patch_size 2, z_dim 48) is not supported yet; tprun runs "
                                      "the Wan 2.1 VAE (Wan 2.1, Wan 2.2 A14B)",
                                      path));
  }
  v.patch_size = positive_or_null(c, "patch_size", path, 1, 64);
  if (v.patch_size != 1) {
    throw CheckpointError(fmt::format("{}: field 'patch_size' is {}: the patchified VAE of Wan 2.2 TI2V-5B is not "
                                      "supported yet (null or 1: the Wan 2.1 VAE)",
                                      path, v.patch_size));
  }
  v.base_dim = config_positive(c, "base_dim", path, v.base_dim, kMaxConfigWidth);
  v.decoder_base_dim = positive_or_null(c, "decoder_base_dim", path, v.base_dim, kMaxConfigWidth);
  v.z_dim = config_positive(c, "z_dim", path, v.z_dim, 4096);
  v.in_channels = config_positive(c, "in_channels", path, v.in_channels, 64);
  v.out_channels = config_positive(c, "out_channels", path, v.out_channels, 64);
  v.dim_mult = vae_dim_mult(c, path, v.dim_mult, {{"base_dim", v.base_dim}, {"decoder_base_dim", v.decoder_base_dim}});
  const size_t n = v.dim_mult.size();
  v.temperal_downsample = vae_temperal_downsample(c, path, v.temperal_downsample, n);
  int64_t time_downs = 0;
  for (bool t : v.temperal_downsample) time_downs += t ? 1 : 0;
  if (time_downs != 2) {
    throw CheckpointError(fmt::format("{}: field 'temperal_downsample' has {} true entries; tprun runs the Wan VAE "
                                      "with exactly 2 (4x in time: the encoder's chunks of 4 frames make one "
                                      "latent frame)",
                                      path, time_downs));
  }
  v.scale_factor_temporal = positive_or_null(c, "scale_factor_temporal", path, 4, 64);
  if (v.scale_factor_temporal != 4) {
    throw CheckpointError(fmt::format("{}: field 'scale_factor_temporal' is {} but the two temporal downsamplings "
                                      "make 4",
                                      path, v.scale_factor_temporal));
  }
  const int64_t spatial = int64_t{1} << (n - 1);
  v.scale_factor_spatial = positive_or_null(c, "scale_factor_spatial", path, 8, int64_t{1} << 16);
  if (v.scale_factor_spatial != spatial) {
    throw CheckpointError(fmt::format("{}: field 'scale_factor_spatial' is {} but the {} levels of dim_mult make {}",
                                      path, v.scale_factor_spatial, n, spatial));
  }
  v.num_res_blocks = vae_num_res_blocks(c, path, v.num_res_blocks, census, n);
  v.attn_scales = vae_number_list(c, "attn_scales", path, {});
  check_vae_attn_scales(v.attn_scales, n, path, "WanEncoder3d");
  v.dropout = vae_dropout(c, path);
  v.latents_mean = vae_latent_stats(c, "latents_mean", path, wan21_latents_mean(), v.z_dim, false);
  v.latents_std = vae_latent_stats(c, "latents_std", path, wan21_latents_std(), v.z_dim, true);
  v.clip_output = config_bool_or(c, "clip_output", path, true);
  return v;
}

ModelTable WanVae::table_for(const WanVaeConfig& config, const ModelOptions& options) {
  ModelTable table = record_table(kClass, [&](ModelBuilder& b) {
    CausalConvLoad load;
    declare_causal_vae(config.layout(), b, load);
  });
  mark_other_part_optional(table, options.part);
  return table;
}

namespace {

// The Vae facts of `config` (causal_vae_info): temporal scale 4.
VaeInfo info_of(const WanVaeConfig& config) {
  return causal_vae_info(WanVae::kClass, config.layout(), config.scale_factor_temporal);
}

}  // namespace

WanVae::WanVae(WanVaeConfig config, const ModelOptions& options, const std::string& config_path)
    : config_(std::move(config)) {
  init_vae(info_of(config_), options);
  tiles_ = CausalVaeTiling::of(tiling(), tile_sample_size(), tile_overlap(), config_.scale_factor_spatial, config_path);
}

std::unique_ptr<WanVae> WanVae::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                     const std::string& config_path, const parallel::TpContext&,
                                     const ModelOptions& options) {
  const TensorCensus census = census_of(source);
  std::unique_ptr<WanVae> m(new WanVae(WanVaeConfig::from_json(config, config_path, &census), options, config_path));
  CausalConvLoad conv_load;  // every time tap meets frames: the 5-D weights kept whole
  CausalVaeBuild b = build_causal_vae(kClass, source, m->config_.layout(), m->part_build_options(options), options,
                                      m->compute_dtype(), conv_load);
  m->finish_load(std::move(b.built.table), b.built.bytes_read, b.built.bytes_stored);
  m->w_ = std::move(b.weights);
  return m;
}

at::Tensor WanVae::to_weights(const at::Tensor& x) const {
  const auto opts = w_->decoder.conv_in.bias.defined() ? w_->decoder.conv_in.bias.get().options()
                                                       : w_->encoder.conv_in.bias.get().options();
  return x.to(opts.device(), opts.dtype().toScalarType());
}

std::optional<Vae::TiledDecode> WanVae::tiled_decode(const at::Tensor& z_in) const {
  if (!has_decoder()) throw ConfigError(fmt::format("{}::decode: the VAE was loaded without its decoder", kClass));
  const at::Tensor z = video_batch(z_in, "z", config_.z_dim);
  const int64_t sf = config_.scale_factor_spatial;
  const std::optional<VaeTileGrid> grid = tiles_.decode_grid(z);
  if (!grid) return std::nullopt;
  TiledDecode t;
  t.input = to_weights(z);
  t.grid = *grid;
  std::shared_ptr<const CausalVaeWeights> w = w_;
  t.tile = [w](const at::Tensor& latents) { return causal_decode_video(*w, latents, nullptr); };
  const int64_t height = z.size(3) * sf, width = z.size(4) * sf;
  const bool clip = config_.clip_output;
  t.finish = [height, width, clip](const at::Tensor& blended) {
    const at::Tensor out = blended.slice(3, 0, height).slice(4, 0, width);
    return clip ? at::clamp(out, -1.0, 1.0) : out;
  };
  return t;
}

at::Tensor WanVae::decode_videos(const at::Tensor& z, Trace* trace) const {
  if (auto plan = tiled_decode(z)) return plan->finish(tiled_apply_grid(plan->input, plan->grid, plan->tile));
  const at::Tensor out = causal_decode_video(*w_, to_weights(z), trace);
  return config_.clip_output ? at::clamp(out, -1.0, 1.0) : out;
}

at::Tensor WanVae::encode_videos(const at::Tensor& x, Trace* trace) const {
  return tiles_.encode(x, trace, [this](const at::Tensor& t, Trace* tr) { return encode_untiled(t, tr); });
}

at::Tensor WanVae::encode_untiled(const at::Tensor& x, Trace* trace) const {
  check_causal_encoder_sides(x.size(3), x.size(4), static_cast<int64_t>(config_.temperal_downsample.size()), "video");
  return causal_encode_video(*w_, to_weights(x), trace);
}

at::Tensor WanVae::decode_images(const at::Tensor&, Trace*) const {
  throw Error(Error::Kind::Internal, "WanVae::decode_images: a video VAE decodes through decode_videos");
}

at::Tensor WanVae::encode_images(const at::Tensor&, Trace*) const {
  throw Error(Error::Kind::Internal, "WanVae::encode_images: a video VAE encodes through encode_videos");
}

at::Tensor WanVae::denormalize(const at::Tensor& z) const {
  return denormalize_latents(z, config_.latents_mean, config_.latents_std, kClass);
}

at::Tensor WanVae::normalize(const at::Tensor& z) const {
  return normalize_latents(z, config_.latents_mean, config_.latents_std, kClass);
}

TPRUN_REGISTER_MODEL(WanVae, WanVaeConfig);

namespace {
VaeInfo read_info(const nlohmann::json& config, const std::string& config_path) {
  return info_of(WanVaeConfig::from_json(config, config_path));
}
}  // namespace

TPRUN_REGISTER_VAE_INFO(WanVae::kClass, read_info);

}  // namespace tprun::models
