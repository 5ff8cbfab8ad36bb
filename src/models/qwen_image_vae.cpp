// AutoencoderKLQwenImage: config, the table of its tensors, loading, and the
// single-frame decode / encode with diffusers' slicing and tiling.
#include "models/qwen_image_vae.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/silu.h>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/causal_vae_blocks.h"
#include "models/causal_vae_config.h"
#include "models/causal_vae_tiling.h"
#include "models/vae_tiling.h"
#include "runtime/error.h"

namespace tprun::models {

int64_t QwenImageVaeConfig::encoder_dim(size_t i) const { return i == 0 ? base_dim : base_dim * dim_mult.at(i - 1); }

QwenImageVaeConfig QwenImageVaeConfig::from_json(const nlohmann::json& c, const std::string& path,
                                                 const TensorCensus* census) {
  check_vae_class(c, path, QwenImageVae::kClass);
  QwenImageVaeConfig v;
  v.base_dim = config_positive(c, "base_dim", path, v.base_dim, kMaxConfigWidth);
  v.z_dim = config_positive(c, "z_dim", path, v.z_dim, 4096);
  v.input_channels = config_positive(c, "input_channels", path, v.input_channels, 64);
  v.dim_mult = vae_dim_mult(c, path, v.dim_mult, {{"base_dim", v.base_dim}});
  const size_t n = v.dim_mult.size();
  v.temperal_downsample = vae_temperal_downsample(c, path, v.temperal_downsample, n);
  v.num_res_blocks = vae_num_res_blocks(c, path, v.num_res_blocks, census, n);
  v.attn_scales = vae_number_list(c, "attn_scales", path, {});
  check_vae_attn_scales(v.attn_scales, n, path, "QwenImageEncoder3d");
  v.dropout = vae_dropout(c, path);
  v.latents_mean = vae_latent_stats(c, "latents_mean", path, wan21_latents_mean(), v.z_dim, false);
  v.latents_std = vae_latent_stats(c, "latents_std", path, wan21_latents_std(), v.z_dim, true);
  return v;
}

namespace {

// The shared layout of `cfg` (one frame: the time_convs unused).
CausalVaeLayout layout_of(const QwenImageVaeConfig& cfg) {
  CausalVaeLayout l;
  l.base_dim = l.decoder_base_dim = cfg.base_dim;
  l.z_dim = cfg.z_dim;
  l.dim_mult = cfg.dim_mult;
  l.num_res_blocks = cfg.num_res_blocks;
  l.temperal_downsample = cfg.temperal_downsample;
  l.in_channels = l.out_channels = cfg.input_channels;
  return l;
}

}  // namespace

ModelTable QwenImageVae::table_for(const QwenImageVaeConfig& config, const ModelOptions& options) {
  ModelTable table = record_table(kClass, [&](ModelBuilder& b) {
    CausalConvLoad load;
    declare_causal_vae(layout_of(config), b, load);
  });
  mark_other_part_optional(table, options.part);
  return table;
}

namespace {

// The Vae facts of `config` (causal_vae_info): temporal scale 1 (tprun
// decodes single frames).
VaeInfo info_of(const QwenImageVaeConfig& config) {
  return causal_vae_info(QwenImageVae::kClass, layout_of(config), 1);
}

}  // namespace

QwenImageVae::QwenImageVae(QwenImageVaeConfig config, const ModelOptions& options, const std::string& config_path)
    : config_(std::move(config)) {
  init_vae(info_of(config_), options);
  // Tiles (diffusers' enable_tiling defaults: 256 px at a stride of 192 = 256 x (1 - 0.25)).
  tiles_ = CausalVaeTiling::of(tiling(), tile_sample_size(), tile_overlap(), config_.scale_factor(), config_path);
}

std::unique_ptr<QwenImageVae> QwenImageVae::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                 const std::string& config_path, const parallel::TpContext&,
                                                 const ModelOptions& options) {
  const TensorCensus census = census_of(source);
  std::unique_ptr<QwenImageVae> m(
      new QwenImageVae(QwenImageVaeConfig::from_json(config, config_path, &census), options, config_path));
  const memory::MemoryOptions& mem = options.memory;
  // Keep only the used time tap when the weights are plainly resident.
  CausalConvLoad conv_load;
  conv_load.last_tap_only = mem.layerwise_storage.empty() && !mem.offload.enabled() && !mem.device_mapped();
  CausalVaeBuild b = build_causal_vae(kClass, source, layout_of(m->config_), m->part_build_options(options), options,
                                      m->compute_dtype(), conv_load);
  m->finish_load(std::move(b.built.table), b.built.bytes_read, b.built.bytes_stored - conv_load.bytes_dropped);
  m->w_ = std::move(b.weights);
  return m;
}

// The tiled decode of z [b, z_dim, h, w] (tiling on and z larger than a latent tile): the grid, the
// tile's decode and the crop, shared by decode_images and tiled_decode.
std::optional<QwenImageVae::TiledDecode> QwenImageVae::tiles_of(const at::Tensor& z) const {
  const int64_t sf = config_.scale_factor();
  const std::optional<VaeTileGrid> grid = tiles_.decode_grid(z);
  if (!grid) return std::nullopt;
  TiledDecode t;
  t.input = z;
  t.grid = *grid;
  t.tile = [this](const at::Tensor& latents) { return decode_frame(latents, nullptr); };
  const int64_t height = z.size(2) * sf, width = z.size(3) * sf;
  t.finish = [height, width](const at::Tensor& blended) { return blended.slice(2, 0, height).slice(3, 0, width); };
  return t;
}

at::Tensor QwenImageVae::decode_images(const at::Tensor& z, Trace* trace) const {
  // As diffusers' decode: tiled when larger than a latent tile (then
  // unclamped), else decoded whole and clamped.
  if (auto plan = tiles_of(z)) return plan->finish(tiled_apply_grid(z, plan->grid, plan->tile));
  return at::clamp(decode_frame(z, trace), -1.0, 1.0);
}

std::optional<Vae::TiledDecode> QwenImageVae::tiled_decode(const at::Tensor& z) const {
  if (!has_decoder()) throw ConfigError(fmt::format("{}::decode: the VAE was loaded without its decoder", kClass));
  std::optional<TiledDecode> plan = tiles_of(image_batch(z, "z", config_.z_dim));
  if (plan) {
    auto crop = std::move(plan->finish);
    plan->finish = [crop](const at::Tensor& blended) { return crop(blended).unsqueeze(2); };  // decode's layout
  }
  return plan;
}

at::Tensor QwenImageVae::decode_frame(const at::Tensor& z_in, Trace* trace) const {
  const CausalDecoderWeights& d = w_->decoder;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t.unsqueeze(2));
  };
  const auto opts = d.conv_in.bias.get().options();
  at::Tensor h = causal_conv_frame(z_in.to(opts.device(), opts.dtype().toScalarType()), w_->post_quant_conv);
  record("post_quant_conv", h);
  h = causal_conv_frame(h, d.conv_in);
  record("decoder.conv_in", h);
  h = mid_block_frame(d.mid, h, w_->attention_chunk);
  record("decoder.mid_block", h);
  for (size_t i = 0; i < d.up.size(); ++i) {
    for (const auto& r : d.up[i].resnets) h = residual_frame(r, h);
    if (d.up[i].has_upsampler) h = resample_frame(d.up[i].upsampler, h);
    record(fmt::format("decoder.up_blocks.{}", i), h);
  }
  h = causal_rms_norm(h, d.norm_out);
  at::silu_(h);
  h = causal_conv_frame(h, d.conv_out);
  record("decoder.conv_out", h);
  return h;
}

at::Tensor QwenImageVae::encode_images(const at::Tensor& x, Trace* trace) const {
  return tiles_.encode(x, trace, [this](const at::Tensor& t, Trace* tr) { return encode_moments(t, tr); });
}

at::Tensor QwenImageVae::encode_moments(const at::Tensor& image, Trace* trace) const {
  check_causal_encoder_sides(image.size(2), image.size(3), static_cast<int64_t>(config_.temperal_downsample.size()),
                             "image");
  const CausalEncoderWeights& e = w_->encoder;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t.unsqueeze(2));
  };
  const auto opts = e.conv_in.bias.get().options();
  at::Tensor h = causal_conv_frame(image.to(opts.device(), opts.dtype().toScalarType()), e.conv_in);
  record("encoder.conv_in", h);
  for (size_t i = 0; i < e.down.size(); ++i) {
    const CausalDownLayer& layer = e.down[i];
    h = layer.is_resample ? resample_frame(layer.resample, h) : residual_frame(layer.resnet, h);
    record(fmt::format("encoder.down_blocks.{}", i), h);
  }
  h = mid_block_frame(e.mid, h, w_->attention_chunk);
  record("encoder.mid_block", h);
  h = causal_rms_norm(h, e.norm_out);
  at::silu_(h);
  h = causal_conv_frame(h, e.conv_out);
  record("encoder.conv_out", h);
  h = causal_conv_frame(h, w_->quant_conv);
  record("quant_conv", h);
  return h;
}

at::Tensor QwenImageVae::latents_mean() const { return latent_stats_tensor(config_.latents_mean); }
at::Tensor QwenImageVae::latents_std() const { return latent_stats_tensor(config_.latents_std); }

// As QwenImagePipeline: fp32 statistics from the config's numbers, then z's
// device and dtype, the reciprocal taken there (latent_stats_for).
at::Tensor QwenImageVae::denormalize(const at::Tensor& z) const {
  return denormalize_latents(z, config_.latents_mean, config_.latents_std, kClass);
}

at::Tensor QwenImageVae::normalize(const at::Tensor& z) const {
  return normalize_latents(z, config_.latents_mean, config_.latents_std, kClass);
}

TPRUN_REGISTER_MODEL(QwenImageVae, QwenImageVaeConfig);

namespace {
VaeInfo read_info(const nlohmann::json& config, const std::string& config_path) {
  return info_of(QwenImageVaeConfig::from_json(config, config_path));
}
}  // namespace

TPRUN_REGISTER_VAE_INFO(QwenImageVae::kClass, read_info);

}  // namespace tprun::models
