// AutoencoderKL: config, validation against the checkpoint, loading, and the
// top-level decode / encode (Decoder / Encoder of diffusers' vae.py).
#include "models/autoencoder_kl.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/silu.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/flux_transformer.h"
#include "models/model_table.h"
#include "models/vae_blocks.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

bool config_bool(const nlohmann::json& c, const std::string& field, const std::string& path, bool fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  if (!c[field].is_boolean()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be true or false, found {}", path, field, c[field].dump()));
  }
  return c[field].get<bool>();
}

std::optional<double> config_number(const nlohmann::json& c, const std::string& field, const std::string& path) {
  if (!c.contains(field) || c[field].is_null()) return std::nullopt;
  if (!c[field].is_number()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a number, found {}", path, field, c[field].dump()));
  }
  return c[field].get<double>();
}

// Length of a block-type list whose every entry must be `want`; absent or
// null: 1 (diffusers' default is one such block).
size_t block_types(const nlohmann::json& c, const std::string& field, const std::string& path,
                   const std::string& want) {
  if (!c.contains(field) || c[field].is_null()) return 1;  // diffusers' default: one block of `want`
  if (!c[field].is_array()) throw CheckpointError(fmt::format("{}: field '{}' must be a list", path, field));
  for (const auto& v : c[field]) {
    if (!v.is_string() || v.get<std::string>() != want) {
      throw CheckpointError(fmt::format("{}: field '{}' holds {}; tprun's AutoencoderKL supports only {}", path,
                                        field, v.dump(), want));
    }
  }
  return c[field].size();
}

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// RequestError unless x is [B, channels, H, W] with B, H, W >= 1.
void check_input(const at::Tensor& x, const char* name, int64_t channels) {
  if (!x.defined()) throw RequestError(fmt::format("input '{}' is missing", name), true);
  if (x.dim() != 4 || x.size(1) != channels || x.numel() == 0) {
    throw RequestError(fmt::format("input '{}' must be [B, {}, H, W] (non-empty), got {}", name, channels,
                                   shape_of(x)),
                       true);
  }
}

}  // namespace

int64_t VaeConfig::scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }

VaeConfig VaeConfig::from_json(const nlohmann::json& c, const std::string& path) {
  if (!c.is_object()) throw CheckpointError(fmt::format("{}: config must be a JSON object", path));
  VaeConfig v;
  v.in_channels = config_int_or_null(c, "in_channels", path).value_or(v.in_channels);
  v.out_channels = config_int_or_null(c, "out_channels", path).value_or(v.out_channels);
  v.layers_per_block = config_int_or_null(c, "layers_per_block", path).value_or(v.layers_per_block);
  v.latent_channels = config_int_or_null(c, "latent_channels", path).value_or(v.latent_channels);
  v.norm_num_groups = config_int_or_null(c, "norm_num_groups", path).value_or(v.norm_num_groups);
  if (c.contains("block_out_channels") && !c["block_out_channels"].is_null()) {
    const auto& b = c["block_out_channels"];
    if (!b.is_array() || b.empty()) {
      throw CheckpointError(fmt::format("{}: field 'block_out_channels' must be a non-empty list", path));
    }
    v.block_out_channels.clear();
    for (const auto& e : b) {
      if (!e.is_number_integer()) {
        throw CheckpointError(fmt::format("{}: field 'block_out_channels' must hold integers, found {}", path,
                                          e.dump()));
      }
      v.block_out_channels.push_back(e.get<int64_t>());
    }
  }
  v.use_quant_conv = config_bool(c, "use_quant_conv", path, true);
  v.use_post_quant_conv = config_bool(c, "use_post_quant_conv", path, true);
  v.mid_block_add_attention = config_bool(c, "mid_block_add_attention", path, true);
  v.force_upcast = config_bool(c, "force_upcast", path, true);
  v.scaling_factor = config_number(c, "scaling_factor", path).value_or(v.scaling_factor);
  const auto shift = config_number(c, "shift_factor", path);
  v.has_shift = shift.has_value();
  v.shift_factor = shift.value_or(0.0);

  if (c.contains("act_fn") && !(c["act_fn"].is_string() && c["act_fn"].get<std::string>() == "silu")) {
    throw CheckpointError(
        fmt::format("{}: field 'act_fn' is {}; tprun's AutoencoderKL supports only \"silu\"", path, c["act_fn"].dump()));
  }
  const size_t n = v.block_out_channels.size();
  using Named = std::pair<const char*, const char*>;
  for (const auto& [field, want] : {Named{"down_block_types", "DownEncoderBlock2D"},
                                     Named{"up_block_types", "UpDecoderBlock2D"}}) {
    const size_t got = block_types(c, field, path, want);
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
  for (int64_t ch : v.block_out_channels) {
    if (ch <= 0 || ch % v.norm_num_groups != 0) {
      throw CheckpointError(fmt::format("{}: block_out_channels entry {} must be a positive multiple of "
                                        "norm_num_groups {}",
                                        path, ch, v.norm_num_groups));
    }
  }
  if (n > 16) throw CheckpointError(fmt::format("{}: block_out_channels has {} entries (at most 16)", path, n));
  return v;
}

bool AutoencoderKL::has_decoder() const { return w_ && w_->has_decoder; }
bool AutoencoderKL::has_encoder() const { return w_ && w_->has_encoder; }

AutoencoderKL AutoencoderKL::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                  const std::string& config_path, const VaeLoadOptions& options) {
  AutoencoderKL m;
  m.config_ = VaeConfig::from_json(config, config_path);
  const VaeConfig& cfg = m.config_;
  const c10::ScalarType requested = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  m.upcast_ = requested != c10::kFloat && cfg.force_upcast;
  m.compute_dtype_ = m.upcast_ || requested == c10::kFloat ? "fp32" : (requested == c10::kBFloat16 ? "bf16" : "fp16");
  if (!options.decoder && !options.encoder) {
    throw ConfigError("VaeLoadOptions: neither decoder nor encoder requested; load at least one");
  }

  auto table = model_table_for(config, config_path);
  if (!table || table->cls != "AutoencoderKL") {
    throw CheckpointError(fmt::format("{}: not an AutoencoderKL config", config_path));
  }
  // Only the requested halves need to be in the checkpoint.
  auto wanted = [&](const std::string& name) {
    const bool enc = name.rfind("encoder.", 0) == 0 || name.rfind("quant_conv.", 0) == 0;
    return enc ? options.encoder : options.decoder;
  };
  ModelTable needed = *table;
  needed.tensors.clear();
  for (const auto& t : table->tensors)
    if (wanted(t.name)) needed.tensors.push_back(t);
  validate_tp_plan(needed, source, 1);  // generic: names and shapes, before any weight byte is read

  checkpoint::LoadOptions lopts{options.mode, options.device, m.compute_dtype_};
  checkpoint::ShardLoader loader(source, lopts);
  const uint64_t before = loader.bytes_read();
  auto w = std::make_shared<VaeWeights>();
  const auto& ch = cfg.block_out_channels;
  const size_t n = ch.size();
  auto load_mid = [&](const std::string& p) {
    MidBlockWeights mid;
    if (cfg.mid_block_add_attention) mid.attentions.push_back(load_attention(loader, p + "attentions.0"));
    for (int i = 0; i < 2; ++i) mid.resnets.push_back(load_resnet(loader, fmt::format("{}resnets.{}", p, i), false));
    return mid;
  };

  if (options.encoder) {
    w->has_encoder = true;
    VaeCoderWeights& e = w->encoder;
    e.conv_in = load_affine(loader, "encoder.conv_in");
    int64_t in = ch[0];
    for (size_t i = 0; i < n; ++i) {
      SampleBlockWeights blk;
      for (int64_t j = 0; j < cfg.layers_per_block; ++j) {
        const int64_t rin = j == 0 ? in : ch[i];
        blk.resnets.push_back(load_resnet(loader, fmt::format("encoder.down_blocks.{}.resnets.{}", i, j), rin != ch[i]));
      }
      blk.has_sampler = i + 1 < n;
      if (blk.has_sampler) blk.sampler = load_affine(loader, fmt::format("encoder.down_blocks.{}.downsamplers.0.conv", i));
      e.blocks.push_back(std::move(blk));
      in = ch[i];
    }
    e.mid = load_mid("encoder.mid_block.");
    e.conv_norm_out = load_affine(loader, "encoder.conv_norm_out");
    e.conv_out = load_affine(loader, "encoder.conv_out");
    if (cfg.use_quant_conv) w->quant_conv = load_affine(loader, "quant_conv");
  }
  if (options.decoder) {
    w->has_decoder = true;
    VaeCoderWeights& d = w->decoder;
    d.conv_in = load_affine(loader, "decoder.conv_in");
    d.mid = load_mid("decoder.mid_block.");
    int64_t in = ch[n - 1];
    for (size_t i = 0; i < n; ++i) {
      const int64_t out = ch[n - 1 - i];
      SampleBlockWeights blk;
      for (int64_t j = 0; j <= cfg.layers_per_block; ++j) {
        const int64_t rin = j == 0 ? in : out;
        blk.resnets.push_back(load_resnet(loader, fmt::format("decoder.up_blocks.{}.resnets.{}", i, j), rin != out));
      }
      blk.has_sampler = i + 1 < n;
      if (blk.has_sampler) blk.sampler = load_affine(loader, fmt::format("decoder.up_blocks.{}.upsamplers.0.conv", i));
      d.blocks.push_back(std::move(blk));
      in = out;
    }
    d.conv_norm_out = load_affine(loader, "decoder.conv_norm_out");
    d.conv_out = load_affine(loader, "decoder.conv_out");
    if (cfg.use_post_quant_conv) w->post_quant_conv = load_affine(loader, "post_quant_conv");
  }
  source.close();
  m.bytes_loaded_ = loader.bytes_read() - before;
  m.w_ = std::move(w);
  return m;
}

at::Tensor AutoencoderKL::decode(const at::Tensor& z_in, Trace* trace) const {
  if (!has_decoder()) throw ConfigError("AutoencoderKL::decode: the VAE was loaded without its decoder");
  check_input(z_in, "z", config_.latent_channels);
  const VaeCoderWeights& d = w_->decoder;
  const int64_t groups = config_.norm_num_groups;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  const auto opts = d.conv_in.weight->options();
  at::Tensor z = z_in.to(opts.device(), opts.dtype().toScalarType());
  if (w_->post_quant_conv.weight) {
    z = conv2d(z, w_->post_quant_conv, 1, 0);
    record("post_quant_conv", z);
  }
  at::Tensor h = conv2d(z, d.conv_in, 1, 1);
  record("decoder.conv_in", h);
  h = mid_block_forward(d.mid, h, groups);
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

TensorMap AutoencoderKL::encode(const at::Tensor& image, Trace* trace) const {
  if (!has_encoder()) throw ConfigError("AutoencoderKL::encode: the VAE was loaded without its encoder");
  check_input(image, "image", config_.in_channels);
  const VaeCoderWeights& e = w_->encoder;
  const int64_t groups = config_.norm_num_groups;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  const auto opts = e.conv_in.weight->options();
  at::Tensor h = conv2d(image.to(opts.device(), opts.dtype().toScalarType()), e.conv_in, 1, 1);
  record("encoder.conv_in", h);
  for (size_t i = 0; i < e.blocks.size(); ++i) {
    h = down_block_forward(e.blocks[i], h, groups);
    record(fmt::format("encoder.down_blocks.{}", i), h);
  }
  h = mid_block_forward(e.mid, h, groups);
  record("encoder.mid_block", h);
  h = group_norm(h, e.conv_norm_out, groups);
  record("encoder.conv_norm_out", h);
  h = conv2d(at::silu(h), e.conv_out, 1, 1);
  record("encoder.conv_out", h);
  if (w_->quant_conv.weight) {
    h = conv2d(h, w_->quant_conv, 1, 0);
    record("quant_conv", h);
  }
  // DiagonalGaussianDistribution: mean, logvar = chunk(moments, 2, dim=1).
  auto parts = h.chunk(2, 1);
  TensorMap out;
  out["mean"] = parts[0].contiguous();
  out["std"] = at::exp(at::clamp(parts[1], -30.0, 20.0) * 0.5);
  return out;
}

}  // namespace tprun::models
