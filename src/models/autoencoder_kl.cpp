// AutoencoderKL: config, validation against the checkpoint, loading, and the
// top-level decode / encode (Decoder / Encoder of diffusers' vae.py).
#include "models/autoencoder_kl.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/silu.h>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/model_config.h"
#include "models/vae_tiling.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/model_builder.h"
#include "models/vae_blocks.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

// Length of a block-type list whose every entry must be `want`; absent or
// null: `fallback` (the class's default list).
size_t block_types(const nlohmann::json& c, const std::string& field, const std::string& path,
                   const std::string& want, size_t fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  if (!c[field].is_array()) throw CheckpointError(fmt::format("{}: field '{}' must be a list", path, field));
  for (const auto& v : c[field]) {
    if (!v.is_string() || v.get<std::string>() != want) {
      throw CheckpointError(fmt::format("{}: field '{}' holds {}; tprun's AutoencoderKL supports only {}", path,
                                        field, v.dump(), want));
    }
  }
  return c[field].size();
}

}  // namespace

int64_t VaeConfig::scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }

namespace {

// The class named by _class_name with its __init__ defaults.
VaeConfig vae_class_defaults(const nlohmann::json& c, const std::string& path) {
  VaeConfig v;
  v.cls = config_class(c).empty() ? std::string(AutoencoderKL::kClass) : config_class(c);
  if (v.cls == "AutoencoderKLFlux2") {
    // AutoencoderKLFlux2.__init__'s defaults.
    v.flux2 = true;
    v.block_out_channels = {128, 256, 512, 512};
    v.layers_per_block = 2;
    v.latent_channels = 32;
  } else if (v.cls != AutoencoderKL::kClass) {
    throw CheckpointError(fmt::format("{}: _class_name '{}' is not AutoencoderKL or AutoencoderKLFlux2", path, v.cls));
  }
  return v;
}

// Channels, blocks per level and the levels, checked against the checkpoint's census when given.
void read_vae_sizes(const nlohmann::json& c, const std::string& path, const TensorCensus* census, VaeConfig& v) {
  v.in_channels = config_positive(c, "in_channels", path, v.in_channels, 64);
  v.out_channels = config_positive(c, "out_channels", path, v.out_channels, 64);
  // The encoder holds layers_per_block resnets per level, the decoder one more
  // (a checkpoint may hold either part alone).
  const bool encoder = census == nullptr || census->blocks("encoder.down_blocks") > 0;
  v.layers_per_block =
      config_block_count(c, "layers_per_block", path, v.layers_per_block, census,
                         {encoder ? "encoder.down_blocks.0.resnets" : "decoder.up_blocks.0.resnets"}, 1,
                         encoder ? 0 : 1, 64);
  v.latent_channels = config_positive(c, "latent_channels", path, v.latent_channels, 4096);
  v.norm_num_groups = config_positive(c, "norm_num_groups", path, v.norm_num_groups, 4096);
  v.block_out_channels = config_int_list_or(c, "block_out_channels", path, v.block_out_channels, 16, 65536);
  if (census != nullptr) {
    const int64_t levels = census->blocks(std::vector<std::string>{"encoder.down_blocks", "decoder.up_blocks"});
    if (static_cast<int64_t>(v.block_out_channels.size()) > levels) {
      throw CheckpointError(fmt::format("{}: field 'block_out_channels' lists {} levels but {} holds {} "
                                        "('encoder.down_blocks.<i>' or 'decoder.up_blocks.<i>')",
                                        path, v.block_out_channels.size(), census->source(), levels));
    }
  }
  v.decoder_block_out_channels =
      config_int_list_or(c, "decoder_block_out_channels", path, v.block_out_channels, 16, 65536);
  if (v.decoder_block_out_channels.size() != v.block_out_channels.size()) {
    throw CheckpointError(fmt::format("{}: field 'decoder_block_out_channels' has {} entries but "
                                      "block_out_channels has {}",
                                      path, v.decoder_block_out_channels.size(), v.block_out_channels.size()));
  }
}

// Switches, tile size, latent scaling and AutoencoderKLFlux2's batch-norm and patch fields.
void read_vae_options(const nlohmann::json& c, const std::string& path, VaeConfig& v) {
  v.use_quant_conv = config_bool_or(c, "use_quant_conv", path, true);
  v.use_post_quant_conv = config_bool_or(c, "use_post_quant_conv", path, true);
  v.mid_block_add_attention = config_bool_or(c, "mid_block_add_attention", path, true);
  v.force_upcast = config_bool_or(c, "force_upcast", path, true);
  if (v.flux2) v.sample_size = 1024;  // AutoencoderKLFlux2.__init__'s default
  if (c.contains("sample_size") && c["sample_size"].is_array() && !c["sample_size"].empty()) {
    const nlohmann::json first = {{"sample_size", c["sample_size"][0]}};
    v.sample_size = config_positive(first, "sample_size", path + " (sample_size[0])", v.sample_size, 1 << 20);
  } else {
    v.sample_size = config_positive(c, "sample_size", path, v.sample_size, 1 << 20);
  }
  v.scaling_factor = config_number_or(c, "scaling_factor", path, v.scaling_factor);
  v.has_shift = c.contains("shift_factor") && !c["shift_factor"].is_null();
  v.shift_factor = config_number_or(c, "shift_factor", path, 0.0);
  if (v.flux2) {
    v.batch_norm_eps = config_number_or(c, "batch_norm_eps", path, v.batch_norm_eps);
    if (!(v.batch_norm_eps > 0 && v.batch_norm_eps < 1)) {
      throw CheckpointError(fmt::format("{}: field 'batch_norm_eps' = {} must be in (0, 1)", path, v.batch_norm_eps));
    }
    const auto patch = config_int_list_or(c, "patch_size", path, {2, 2}, 2, 16);
    if (patch != std::vector<int64_t>{2, 2}) {
      throw CheckpointError(fmt::format("{}: field 'patch_size' must be [2, 2] (the FLUX.2 pipelines' 2x2 patches)",
                                        path));
    }
  }
}

// What tprun's AutoencoderKL runs: silu, the plain block types of every
// level, positive sizes, channels divisible by norm_num_groups, at most 16 levels.
void check_vae_structure(const nlohmann::json& c, const std::string& path, const VaeConfig& v) {
  if (c.contains("act_fn") && !(c["act_fn"].is_string() && c["act_fn"].get<std::string>() == "silu")) {
    throw CheckpointError(
        fmt::format("{}: field 'act_fn' is {}; tprun's AutoencoderKL supports only \"silu\"", path, c["act_fn"].dump()));
  }
  const size_t n = v.block_out_channels.size();
  using Named = std::pair<const char*, const char*>;
  for (const auto& [field, want] : {Named{"down_block_types", "DownEncoderBlock2D"},
                                     Named{"up_block_types", "UpDecoderBlock2D"}}) {
    const size_t got = block_types(c, field, path, want, v.flux2 ? 4 : 1);
    if (got != n) {
      throw CheckpointError(fmt::format("{}: field '{}' has {} entries but block_out_channels has {}", path, field,
                                        got, n));
    }
  }
  using Size = std::pair<const char*, int64_t>;
  for (const auto& [field, value] :
       {Size{"in_channels", v.in_channels}, Size{"out_channels", v.out_channels},
        Size{"layers_per_block", v.layers_per_block}, Size{"latent_channels", v.latent_channels},
        Size{"norm_num_groups", v.norm_num_groups}}) {
    if (value <= 0) throw CheckpointError(fmt::format("{}: field '{}' must be positive, got {}", path, field, value));
  }
  std::vector<int64_t> all_channels = v.block_out_channels;
  all_channels.insert(all_channels.end(), v.decoder_block_out_channels.begin(), v.decoder_block_out_channels.end());
  for (int64_t ch : all_channels) {
    if (ch <= 0 || ch % v.norm_num_groups != 0) {
      throw CheckpointError(fmt::format("{}: block_out_channels entry {} must be a positive multiple of "
                                        "norm_num_groups {}",
                                        path, ch, v.norm_num_groups));
    }
  }
  if (n > 16) throw CheckpointError(fmt::format("{}: block_out_channels has {} entries (at most 16)", path, n));
}

}  // namespace

VaeConfig VaeConfig::from_json(const nlohmann::json& c, const std::string& path, const TensorCensus* census) {
  if (!c.is_object()) throw CheckpointError(fmt::format("{}: config must be a JSON object", path));
  VaeConfig v = vae_class_defaults(c, path);
  read_vae_sizes(c, path, census, v);
  read_vae_options(c, path, v);
  check_vae_structure(c, path, v);
  return v;
}

namespace {

// The whole model's declarations in module order: encoder (conv_in,
// down_blocks, mid_block, conv_norm_out, conv_out), decoder (conv_in,
// up_blocks, mid_block, ...: up_blocks are registered before mid_block in
// diffusers' Decoder), quant_conv, post_quant_conv (each only when its use_*
// flag is true). All replicated.
VaeWeights declare_vae(const VaeConfig& cfg, ModelBuilder& b) {
  VaeWeights w;
  const auto& ch = cfg.block_out_channels;
  const size_t n = ch.size();

  VaeCoderWeights& e = w.encoder;
  e.conv_in = b.conv2d("encoder.conv_in", ch[0], cfg.in_channels, 3);
  int64_t in = ch[0];
  for (size_t i = 0; i < n; ++i) {
    SampleBlockWeights blk;
    for (int64_t j = 0; j < cfg.layers_per_block; ++j)
      blk.resnets.push_back(declare_resnet(b, fmt::format("encoder.down_blocks.{}.resnets.{}", i, j), j == 0 ? in : ch[i], ch[i]));
    blk.has_sampler = i + 1 < n;
    if (blk.has_sampler) blk.sampler = b.conv2d(fmt::format("encoder.down_blocks.{}.downsamplers.0.conv", i), ch[i], ch[i], 3);
    e.blocks.push_back(std::move(blk));
    in = ch[i];
  }
  e.mid = declare_mid_block(b, "encoder.mid_block", ch[n - 1], cfg.mid_block_add_attention);
  e.conv_norm_out = b.norm("encoder.conv_norm_out", ch[n - 1]);
  e.conv_out = b.conv2d("encoder.conv_out", 2 * cfg.latent_channels, ch[n - 1], 3);  // double_z: mean and logvar

  const auto& dch = cfg.decoder_block_out_channels;
  VaeCoderWeights& d = w.decoder;
  d.conv_in = b.conv2d("decoder.conv_in", dch[n - 1], cfg.latent_channels, 3);
  in = dch[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const int64_t out = dch[n - 1 - i];
    SampleBlockWeights blk;
    for (int64_t j = 0; j <= cfg.layers_per_block; ++j)
      blk.resnets.push_back(declare_resnet(b, fmt::format("decoder.up_blocks.{}.resnets.{}", i, j), j == 0 ? in : out, out));
    blk.has_sampler = i + 1 < n;
    if (blk.has_sampler) blk.sampler = b.conv2d(fmt::format("decoder.up_blocks.{}.upsamplers.0.conv", i), out, out, 3);
    d.blocks.push_back(std::move(blk));
    in = out;
  }
  d.mid = declare_mid_block(b, "decoder.mid_block", dch[n - 1], cfg.mid_block_add_attention);
  d.conv_norm_out = b.norm("decoder.conv_norm_out", dch[0]);
  d.conv_out = b.conv2d("decoder.conv_out", cfg.out_channels, dch[0], 3);

  if (cfg.use_quant_conv) w.quant_conv = b.conv2d("quant_conv", 2 * cfg.latent_channels, 2 * cfg.latent_channels, 1);
  if (cfg.use_post_quant_conv) w.post_quant_conv = b.conv2d("post_quant_conv", cfg.latent_channels, cfg.latent_channels, 1);
  if (cfg.flux2) {
    // BatchNorm2d(4 * latent_channels, affine=False): the statistics of the 2x2-patchified latents.
    const int64_t bn = 4 * cfg.latent_channels;
    w.bn_mean = b.tensor("bn.running_mean", {bn}, TensorKind::Buffer);
    w.bn_var = b.tensor("bn.running_var", {bn}, TensorKind::Buffer);
    b.unused("bn.num_batches_tracked", {}, TensorKind::Counter);  // not used at inference
  }
  return w;
}

}  // namespace

ModelTable AutoencoderKL::table_for(const VaeConfig& config, const ModelOptions& options) {
  ModelTable table = record_table(config.cls, [&](ModelBuilder& b) { declare_vae(config, b); });
  mark_other_part_optional(table, options.part);
  return table;
}

namespace {

// The Vae facts of `config`: decoder channels lowest resolution first
// (decoder_block_out_channels reversed), the default tile sample_size.
VaeInfo info_of(const VaeConfig& config) {
  VaeInfo info;
  info.cls = config.cls;
  info.latent_channels = config.latent_channels;
  info.spatial_scale = config.scale_factor();
  info.default_tile_sample = config.sample_size;
  info.force_upcast = config.force_upcast;
  const auto& channels =
      config.decoder_block_out_channels.empty() ? config.block_out_channels : config.decoder_block_out_channels;
  info.decoder_channels.assign(channels.rbegin(), channels.rend());
  info.sample_channels = config.in_channels;
  return info;
}

}  // namespace

AutoencoderKL::AutoencoderKL(VaeConfig config, const ModelOptions& options) : config_(std::move(config)) {
  init_vae(info_of(config_), options);
  upcast_ = checkpoint::parse_compute_dtype(options.dtype, "dtype") != c10::kFloat && config_.force_upcast;
}

std::unique_ptr<AutoencoderKL> AutoencoderKL::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                   const std::string& config_path, const parallel::TpContext&,
                                                   const ModelOptions& options) {
  const TensorCensus census = census_of(source);
  std::unique_ptr<AutoencoderKL> m(new AutoencoderKL(VaeConfig::from_json(config, config_path, &census), options));
  const VaeConfig& cfg = m->config_;
  const int64_t attention_chunk = nn::checked_attention_chunk(options.memory.attention_chunk);
  auto w = std::make_shared<VaeWeights>();
  BuiltModel built = build_model(cfg.cls, source, parallel::TpContext{}, m->part_build_options(options),
                                 [&](ModelBuilder& b) { *w = declare_vae(cfg, b); });
  w->attention_chunk = attention_chunk;
  m->finish_load(std::move(built.table), built.bytes_read, built.bytes_stored);
  if (cfg.mid_block_add_attention) {  // one head of all the mid-block's channels
    const auto& mid = m->has_decoder() ? cfg.decoder_block_out_channels : cfg.block_out_channels;
    nn::log_sdpa_attention(cfg.cls, options.device, checkpoint::parse_compute_dtype(m->compute_dtype(), "dtype"), 1,
                           mid.back(), false, attention_chunk);
  }
  m->w_ = std::move(w);
  const int64_t tile = m->tile_sample_size();
  if (m->tiling() && (tile < cfg.scale_factor() || tile % cfg.scale_factor() != 0)) {
    throw ConfigError(fmt::format("{}: VAE tiles of {} px are not a multiple of the scale factor {} (set "
                                  "vae_tile_sample_size)",
                                  config_path, tile, cfg.scale_factor()),
                      true);
  }
  return m;
}

at::Tensor AutoencoderKL::decode_images(const at::Tensor& z, Trace* trace) const {
  const VaeTiles tiles{tile_latent_size(), tile_sample_size(), tile_overlap()};
  if (tiling() && needs_tiles(z, tiles)) {
    return tiled_apply(z, tiles, [&](const at::Tensor& t) { return decode_plain(t, nullptr); });
  }
  return decode_plain(z, trace);
}

at::Tensor AutoencoderKL::decode_plain(const at::Tensor& z_in, Trace* trace) const {
  const VaeCoderWeights& d = w_->decoder;
  const int64_t groups = config_.norm_num_groups;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  const auto opts = d.conv_in.weight.get().options();
  at::Tensor z = z_in.to(opts.device(), opts.dtype().toScalarType());
  if (w_->post_quant_conv.weight.defined()) {
    z = conv2d(z, w_->post_quant_conv, 1, 0);
    record("post_quant_conv", z);
  }
  at::Tensor h = conv2d(z, d.conv_in, 1, 1);
  record("decoder.conv_in", h);
  h = mid_block_forward(d.mid, h, groups, w_->attention_chunk);
  record("decoder.mid_block", h);
  for (size_t i = 0; i < d.blocks.size(); ++i) {
    h = up_block_forward(d.blocks[i], h, groups);
    record(fmt::format("decoder.up_blocks.{}", i), h);
  }
  h = group_norm(h, d.conv_norm_out, groups);
  record("decoder.conv_norm_out", h);
  h = conv2d(at::silu(h), d.conv_out, 1, 1);
  record("decoder.conv_out", h);
  return h;
}

at::Tensor AutoencoderKL::encode_images(const at::Tensor& image, Trace* trace) const {
  const VaeTiles tiles{tile_sample_size(), tile_latent_size(), tile_overlap()};
  if (tiling() && needs_tiles(image, tiles)) {
    return tiled_apply(image, tiles, [&](const at::Tensor& t) { return encode_moments(t, nullptr); });
  }
  return encode_moments(image, trace);
}

at::Tensor AutoencoderKL::encode_moments(const at::Tensor& image, Trace* trace) const {
  const VaeCoderWeights& e = w_->encoder;
  const int64_t groups = config_.norm_num_groups;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  const auto opts = e.conv_in.weight.get().options();
  at::Tensor h = conv2d(image.to(opts.device(), opts.dtype().toScalarType()), e.conv_in, 1, 1);
  record("encoder.conv_in", h);
  for (size_t i = 0; i < e.blocks.size(); ++i) {
    h = down_block_forward(e.blocks[i], h, groups);
    record(fmt::format("encoder.down_blocks.{}", i), h);
  }
  h = mid_block_forward(e.mid, h, groups, w_->attention_chunk);
  record("encoder.mid_block", h);
  h = group_norm(h, e.conv_norm_out, groups);
  record("encoder.conv_norm_out", h);
  h = conv2d(at::silu(h), e.conv_out, 1, 1);
  record("encoder.conv_out", h);
  if (w_->quant_conv.weight.defined()) {
    h = conv2d(h, w_->quant_conv, 1, 0);
    record("quant_conv", h);
  }
  return h;
}

at::Tensor AutoencoderKL::latent_bn_mean() const {
  if (!config_.flux2) throw Error(Error::Kind::Internal, "latent_bn_mean: not an AutoencoderKLFlux2");
  return w_->bn_mean.get();
}

at::Tensor AutoencoderKL::latent_bn_std() const {
  if (!config_.flux2) throw Error(Error::Kind::Internal, "latent_bn_std: not an AutoencoderKLFlux2");
  return at::sqrt(w_->bn_var.get() + config_.batch_norm_eps);
}

std::pair<at::Tensor, at::Tensor> AutoencoderKL::bn_stats_for(const at::Tensor& z) const {
  const int64_t channels = 4 * config_.latent_channels;
  if (!z.defined() || z.dim() != 4 || z.size(1) != channels) {
    throw RequestError(fmt::format("{}: latents 'z' must be the 2x2-patchified [B, {}, h, w], got {}", config_.cls,
                                   channels, z.defined() ? checkpoint::shape_string(z.sizes().vec()) : "none"),
                       true);
  }
  // As Flux2Pipeline: the statistics moved to z's device and dtype.
  return {latent_bn_std().to(z.device(), z.scalar_type()).view({1, -1, 1, 1}),
          latent_bn_mean().to(z.device(), z.scalar_type()).view({1, -1, 1, 1})};
}

at::Tensor AutoencoderKL::denormalize(const at::Tensor& z) const {
  if (config_.flux2) {
    const auto [sd, mean] = bn_stats_for(z);
    return z * sd + mean;
  }
  image_batch(z, "z", config_.latent_channels);
  return z / config_.scaling_factor + config_.shift_factor;
}

at::Tensor AutoencoderKL::normalize(const at::Tensor& z) const {
  if (config_.flux2) {
    const auto [sd, mean] = bn_stats_for(z);
    return (z - mean) / sd;
  }
  image_batch(z, "z", config_.latent_channels);
  return (z - config_.shift_factor) * config_.scaling_factor;
}

TPRUN_REGISTER_MODEL(AutoencoderKL, VaeConfig);
TPRUN_REGISTER_MODEL_AS("AutoencoderKLFlux2", AutoencoderKL, VaeConfig);

namespace {
VaeInfo read_info(const nlohmann::json& config, const std::string& config_path) {
  return info_of(VaeConfig::from_json(config, config_path));
}
}  // namespace

TPRUN_REGISTER_VAE_INFO("AutoencoderKL", read_info);
TPRUN_REGISTER_VAE_INFO("AutoencoderKLFlux2", read_info);

}  // namespace tprun::models
