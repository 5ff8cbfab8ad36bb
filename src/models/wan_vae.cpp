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
#include "models/causal_vae_video.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/vae_tiling.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

constexpr size_t kMaxLevels = 16;
constexpr int64_t kDefaultTile = 256;  // diffusers' tile_sample_min_height / _width (px)

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
  if (!c.is_object()) throw CheckpointError(fmt::format("{}: config must be a JSON object", path));
  const std::string cls = config_class(c);
  if (!cls.empty() && cls != WanVae::kClass) {
    throw CheckpointError(fmt::format("{}: _class_name '{}' is not {}", path, clip_text(cls), WanVae::kClass));
  }
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
  v.dim_mult = config_int_list_or(c, "dim_mult", path, v.dim_mult, kMaxLevels, kMaxConfigWidth);
  if (v.dim_mult.empty()) throw CheckpointError(fmt::format("{}: field 'dim_mult' must not be empty", path));
  for (int64_t m : v.dim_mult) {
    for (const auto& [field, base] : {std::pair<const char*, int64_t>{"base_dim", v.base_dim},
                                      std::pair<const char*, int64_t>{"decoder_base_dim", v.decoder_base_dim}}) {
      const int64_t ch = config_product(path, {{field, base}, {"dim_mult entry", m}}, kMaxConfigWidth);
      if (ch < 2) {
        throw CheckpointError(fmt::format("{}: {} {} x dim_mult entry {} = {} channels; the decoder's upsamplers "
                                          "halve a level's channels, so each level needs at least 2",
                                          path, field, base, m, ch));
      }
    }
  }
  const size_t n = v.dim_mult.size();
  v.temperal_downsample = vae_bool_list(c, "temperal_downsample", path, v.temperal_downsample);
  if (v.temperal_downsample.size() != n - 1) {
    throw CheckpointError(fmt::format("{}: field 'temperal_downsample' has {} entries but dim_mult has {} levels "
                                      "(one entry per downsampling: {})",
                                      path, v.temperal_downsample.size(), n, n - 1));
  }
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
  const bool census_decoder = census != nullptr && census->blocks("decoder.up_blocks") > 0;
  v.num_res_blocks = config_block_count(c, "num_res_blocks", path, v.num_res_blocks, census_decoder ? census : nullptr,
                                        {"decoder.up_blocks.0.resnets"}, 1, 1, 64);
  if (census_decoder && census->blocks("decoder.up_blocks") < static_cast<int64_t>(n)) {
    throw CheckpointError(fmt::format("{}: field 'dim_mult' lists {} levels but {} holds {} 'decoder.up_blocks.<i>'",
                                      path, n, census->source(), census->blocks("decoder.up_blocks")));
  }
  v.attn_scales = vae_number_list(c, "attn_scales", path, {});
  check_vae_attn_scales(v.attn_scales, n, path, "WanEncoder3d");
  v.dropout = config_number_or(c, "dropout", path, 0.0);
  if (!(v.dropout >= 0 && v.dropout < 1)) {
    throw CheckpointError(fmt::format("{}: field 'dropout' = {} must be in [0, 1)", path, v.dropout));
  }
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

// The Vae facts of `config`: decoder channels decoder_base_dim x
// reversed(dim_mult) (lowest resolution first), tiles of 256 px by default,
// temporal scale 4, no upcast, latents with a frame axis.
VaeInfo info_of(const WanVaeConfig& config) {
  VaeInfo info;
  info.cls = WanVae::kClass;
  info.latent_channels = config.z_dim;
  info.spatial_scale = config.scale_factor_spatial;
  info.temporal_scale = config.scale_factor_temporal;
  info.default_tile_sample = kDefaultTile;
  for (auto it = config.dim_mult.rbegin(); it != config.dim_mult.rend(); ++it) {
    info.decoder_channels.push_back(config.decoder_base_dim * *it);
  }
  info.sample_channels = config.in_channels;
  info.frame_axis = true;
  return info;
}

}  // namespace

WanVae::WanVae(WanVaeConfig config, const ModelOptions& options, const std::string& config_path)
    : config_(std::move(config)) {
  init_vae(info_of(config_), options);
  tile_stride_ = static_cast<int64_t>(static_cast<double>(tile_sample_size()) * (1 - tile_overlap()));
  if (tiling()) check_vae_tile_stride(tile_sample_size(), tile_overlap(), config_.scale_factor_spatial, config_path);
}

std::unique_ptr<WanVae> WanVae::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                     const std::string& config_path, const parallel::TpContext&,
                                     const ModelOptions& options) {
  const TensorCensus census = census_of(source);
  std::unique_ptr<WanVae> m(new WanVae(WanVaeConfig::from_json(config, config_path, &census), options, config_path));
  const WanVaeConfig& cfg = m->config_;
  const int64_t attention_chunk = nn::checked_attention_chunk(options.memory.attention_chunk);
  CausalConvLoad conv_load;  // every time tap meets frames: the 5-D weights kept whole
  auto w = std::make_shared<CausalVaeWeights>();
  BuiltModel built = build_model(kClass, source, parallel::TpContext{}, m->part_build_options(options),
                                 [&](ModelBuilder& b) { *w = declare_causal_vae(cfg.layout(), b, conv_load); });
  w->attention_chunk = attention_chunk;
  nn::log_sdpa_attention(kClass, options.device, checkpoint::parse_compute_dtype(m->compute_dtype(), "dtype"), 1,
                         cfg.layout().decoder_top(), false, attention_chunk);
  m->finish_load(std::move(built.table), built.bytes_read, built.bytes_stored);
  m->w_ = std::move(w);
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
  const int64_t tile = tile_sample_size() / sf;
  if (!tiling() || (z.size(3) <= tile && z.size(4) <= tile)) return std::nullopt;
  TiledDecode t;
  t.input = to_weights(z);
  t.grid = VaeTileGrid{tile, tile_stride_ / sf, tile_sample_size() - tile_stride_, tile_stride_};
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
  const int64_t sf = config_.scale_factor_spatial;
  const int64_t tile = tile_sample_size();
  if (tiling() && (x.size(3) > tile || x.size(4) > tile)) {
    const int64_t stride = tile_stride_ / sf;
    const VaeTileGrid grid{tile, tile_stride_, tile / sf - stride, stride};
    const at::Tensor out = tiled_apply_grid(x, grid, [&](const at::Tensor& t) { return encode_untiled(t, nullptr); });
    return out.slice(3, 0, x.size(3) / sf).slice(4, 0, x.size(4) / sf);
  }
  return encode_untiled(x, trace);
}

at::Tensor WanVae::encode_untiled(const at::Tensor& x, Trace* trace) const {
  // Each downsampler pads one row / column and runs a 3x3 conv at stride 2: it
  // needs 2 px or more (diffusers' encoder fails below that as well).
  const int64_t downsamplers = static_cast<int64_t>(config_.temperal_downsample.size());
  for (int64_t side : {x.size(3), x.size(4)}) {
    int64_t s = side;
    for (int64_t i = 0; i < downsamplers; ++i, s = (s + 1) / 2) {
      if (s < 2) {
        throw RequestError(fmt::format("input 'image': a side of {} px (of the video or of one of its tiles) is "
                                       "too small for the encoder's {} downsamplings, each of which needs at "
                                       "least 2 px (give at least {} px per side)",
                                       side, downsamplers, (int64_t{1} << (downsamplers - 1)) + 1),
                           true);
      }
    }
  }
  return causal_encode_video(*w_, to_weights(x), trace);
}

at::Tensor WanVae::decode_images(const at::Tensor&, Trace*) const {
  throw Error(Error::Kind::Internal, "WanVae::decode_images: a video VAE decodes through decode_videos");
}

at::Tensor WanVae::encode_images(const at::Tensor&, Trace*) const {
  throw Error(Error::Kind::Internal, "WanVae::encode_images: a video VAE encodes through encode_videos");
}

at::Tensor WanVae::denormalize(const at::Tensor& z) const {
  const auto [mean, inv_std] = latent_stats_for(z, config_.latents_mean, config_.latents_std, kClass);
  return z / inv_std + mean;
}

at::Tensor WanVae::normalize(const at::Tensor& z) const {
  const auto [mean, inv_std] = latent_stats_for(z, config_.latents_mean, config_.latents_std, kClass);
  return (z - mean) * inv_std;
}

TPRUN_REGISTER_MODEL(WanVae, WanVaeConfig);

namespace {
VaeInfo read_info(const nlohmann::json& config, const std::string& config_path) {
  return info_of(WanVaeConfig::from_json(config, config_path));
}
}  // namespace

TPRUN_REGISTER_VAE_INFO(WanVae::kClass, read_info);

}  // namespace tprun::models
