// The Vae interface's shared half: the registry of VaeInfo readers, the
// memory estimate's decoder shape, and what every VAE class does alike when it
// loads (part, switches, compute dtype) and runs (forward, slicing, the
// latent distribution).
#include "models/vae.h"

#include <map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/torch_dtype.h"
#include "memory/memory_options.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/nn_ops.h"
#include "models/vae_tiling.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

std::map<std::string, VaeInfoReader>& readers() {
  static std::map<std::string, VaeInfoReader> r;
  return r;
}

const char* dtype_name(c10::ScalarType t) {
  return t == c10::kFloat ? "fp32" : (t == c10::kBFloat16 ? "bf16" : "fp16");
}

bool in_encoder(const std::string& name) { return name.rfind("encoder.", 0) == 0 || name.rfind("quant_conv.", 0) == 0; }
bool in_decoder(const std::string& name) {
  return name.rfind("decoder.", 0) == 0 || name.rfind("post_quant_conv.", 0) == 0;
}

// vae_shape with the tiling as given (MemoryOptions, or as a VAE was loaded).
VaeShape decoder_shape(const VaeInfo& info, const std::string& compute_dtype, const std::string& device, bool tiling,
                       int64_t tile_sample) {
  VaeShape s;
  s.decoder_channels = info.decoder_channels;
  s.latent_channels = info.latent_channels;
  s.scale_factor = info.spatial_scale;
  s.temporal_scale = info.temporal_scale;
  const c10::ScalarType st = checkpoint::parse_compute_dtype(compute_dtype, "vae dtype");
  s.elem_bytes = static_cast<int64_t>(c10::elementSize(st));
  // One head over the widest level's channels: the mid-block's attention.
  const int64_t widest = s.decoder_channels.empty() ? 64 : s.decoder_channels.front();
  s.scores_materialised = nn::sdpa_backend(device, st, 1, widest, false).find("math") != std::string::npos;
  s.tiling = tiling;
  s.tile_sample = tile_sample > 0 ? tile_sample : info.default_tile_sample;
  return s;
}

}  // namespace

namespace detail {
bool register_vae_info(const char* cls, VaeInfoReader reader) {
  readers()[cls] = std::move(reader);
  return true;
}
}  // namespace detail

VaeInfo read_vae_info(const nlohmann::json& config, const std::string& config_path) {
  const std::string cls = config_class(config);
  auto it = readers().find(cls);
  if (it == readers().end()) {
    std::vector<std::string> known;
    for (const auto& [name, reader] : readers()) known.push_back(name);
    throw CheckpointError(fmt::format("{}: class '{}' is not a VAE tprun can run (known: {})", config_path,
                                      cls.empty() ? "(none: no _class_name)" : clip_text(cls), fmt::join(known, ", ")),
                          true);
  }
  return it->second(config, config_path);
}

void check_vae_tile_stride(int64_t tile_sample, double overlap, int64_t scale_factor, const std::string& config_path) {
  const auto stride = static_cast<int64_t>(static_cast<double>(tile_sample) * (1 - overlap));
  if (tile_sample < scale_factor || stride < scale_factor) {
    throw ConfigError(fmt::format("{}: VAE tiles of {} px at a stride of {} px (vae_tile_sample_size x (1 - "
                                  "vae_tile_overlap)) must both be at least the scale factor {} (one latent)",
                                  config_path, tile_sample, stride, scale_factor),
                      true);
  }
}

std::string vae_compute_dtype(const VaeInfo& info, const std::string& dtype) {
  const c10::ScalarType requested = checkpoint::parse_compute_dtype(dtype, "dtype");
  return info.force_upcast ? "fp32" : dtype_name(requested);
}

VaeShape vae_shape(const VaeInfo& info, const std::string& compute_dtype, const std::string& device,
                   const memory::MemoryOptions& memory) {
  return decoder_shape(info, compute_dtype, device, memory.vae_tiling, memory.vae_tile_sample_size);
}

VaeShape Vae::memory_shape(const std::string& device) const {
  return decoder_shape(info_, compute_dtype_, device, switches_.tiling, switches_.tile_sample);
}

TensorMap Vae::forward(const TensorMap& inputs, Trace* trace) const {
  const bool has_latents = inputs.count("latents") != 0, has_image = inputs.count("image") != 0;
  if (has_latents == has_image) {
    throw RequestError(
        fmt::format("{}: give exactly one input: 'latents' (decode) or 'image' (encode)", info_.cls), true);
  }
  if (has_latents) return {{"sample", decode(inputs.at("latents"), trace)}};
  return encode(inputs.at("image"), trace);
}

std::string Vae::primary_output() const { return has_decoder() ? "sample" : "mean"; }

TensorMap Vae::example_inputs(uint64_t seed) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto shape = [&](int64_t channels, int64_t side) {
    return info_.frame_axis ? std::vector<int64_t>{1, channels, 1, side, side}
                            : std::vector<int64_t>{1, channels, side, side};
  };
  if (has_decoder()) return {{"latents", at::randn(shape(info_.latent_channels, 4), gen, f32)}};
  return {{"image", at::rand(shape(info_.sample_channels, 4 * info_.spatial_scale), gen, f32) * 2 - 1}};
}

void Vae::init_vae(VaeInfo info, const ModelOptions& options) {
  compute_dtype_ = vae_compute_dtype(info, options.dtype);
  const std::string& part = options.part;
  if (!part.empty() && part != "decoder" && part != "encoder") {
    throw ConfigError(fmt::format("{}: part '{}' is not 'decoder' or 'encoder'", info.cls, part), true);
  }
  const memory::MemoryOptions& mem = options.memory;
  switches_.part = part;
  switches_.slicing = mem.vae_slicing;
  switches_.tiling = mem.vae_tiling;
  switches_.tile_sample = mem.vae_tile_sample_size > 0 ? mem.vae_tile_sample_size : info.default_tile_sample;
  switches_.tile_overlap = mem.vae_tile_overlap;
  device_ = options.device;
  info_ = std::move(info);
}

BuildOptions Vae::part_build_options(const ModelOptions& options) const {
  BuildOptions bo = build_options(options);
  bo.dtype = compute_dtype_;
  // Only the requested half needs to be in the checkpoint; tensors of
  // neither half (AutoencoderKLFlux2's latent statistics) go with both.
  if (switches_.part == "encoder") bo.wanted = [](const std::string& name) { return !in_decoder(name); };
  if (switches_.part == "decoder") bo.wanted = [](const std::string& name) { return !in_encoder(name); };
  return bo;
}

void Vae::finish_load(ModelTable table, uint64_t bytes_read, uint64_t bytes_stored) {
  table_ = std::move(table);
  bytes_loaded_ = bytes_read;
  bytes_stored_ = bytes_stored;
  loaded_ = true;
}

void Vae::mark_other_part_optional(ModelTable& table, const std::string& part) {
  for (auto& t : table.tensors) {
    if ((part == "decoder" && in_encoder(t.name)) || (part == "encoder" && in_decoder(t.name))) t.optional = true;
  }
}

at::Tensor Vae::image_batch(const at::Tensor& x, const char* name, int64_t channels) const {
  if (!x.defined()) throw RequestError(fmt::format("input '{}' is missing", name), true);
  const bool one_frame = info_.frame_axis && x.dim() == 5 && x.size(2) == 1;
  if (!(x.dim() == 4 || one_frame) || x.size(1) != channels || x.numel() == 0) {
    const std::string got = checkpoint::shape_string(x.sizes().vec());
    throw RequestError(info_.frame_axis
                           ? fmt::format("input '{}' must be [B, {}, 1, H, W] or [B, {}, H, W] (non-empty, one frame: "
                                         "tprun's {} decodes and encodes images, not videos), got {}",
                                         name, channels, channels, info_.cls, got)
                           : fmt::format("input '{}' must be [B, {}, H, W] (non-empty), got {}", name, channels, got),
                       true);
  }
  return one_frame ? x.squeeze(2) : x;
}

at::Tensor Vae::video_batch(const at::Tensor& x, const char* name, int64_t channels) const {
  if (!x.defined()) throw RequestError(fmt::format("input '{}' is missing", name), true);
  if (!(x.dim() == 4 || x.dim() == 5) || x.size(1) != channels || x.numel() == 0) {
    throw RequestError(fmt::format("input '{}' must be [B, {}, F, H, W] or [B, {}, H, W] (non-empty), got {}", name,
                                   channels, channels, checkpoint::shape_string(x.sizes().vec())),
                       true);
  }
  return x.dim() == 4 ? x.unsqueeze(2) : x;
}

at::Tensor Vae::decode_videos(const at::Tensor&, Trace*) const {
  throw Error(Error::Kind::Internal, fmt::format("{}: decode_videos called on a VAE without a time axis", info_.cls));
}

at::Tensor Vae::encode_videos(const at::Tensor&, Trace*) const {
  throw Error(Error::Kind::Internal, fmt::format("{}: encode_videos called on a VAE without a time axis", info_.cls));
}

std::optional<Vae::TiledDecode> Vae::tiled_decode(const at::Tensor&) const { return std::nullopt; }

at::Tensor Vae::decode(const at::Tensor& z, Trace* trace) const {
  if (!has_decoder()) throw ConfigError(fmt::format("{}::decode: the VAE was loaded without its decoder", info_.cls));
  if (info_.temporal_scale > 1) {
    const at::Tensor videos = video_batch(z, "z", info_.latent_channels);
    auto one = [&](const at::Tensor& slice) { return decode_videos(slice, trace); };
    return switches_.slicing ? sliced_apply(videos, one) : one(videos);
  }
  const at::Tensor images = image_batch(z, "z", info_.latent_channels);
  // As diffusers: slicing splits the batch, each slice tiled when larger than a tile.
  auto one = [&](const at::Tensor& slice) { return decode_images(slice, trace); };
  const at::Tensor out = switches_.slicing ? sliced_apply(images, one) : one(images);
  return info_.frame_axis ? out.unsqueeze(2) : out;
}

TensorMap Vae::encode(const at::Tensor& image, Trace* trace) const {
  if (!has_encoder()) throw ConfigError(fmt::format("{}::encode: the VAE was loaded without its encoder", info_.cls));
  if (info_.temporal_scale > 1) {
    const at::Tensor videos = video_batch(image, "image", info_.sample_channels);
    const int64_t frames = videos.size(2), t = info_.temporal_scale;
    if ((frames - 1) % t != 0) {
      const int64_t below = 1 + t * ((frames - 1) / t);
      throw RequestError(fmt::format("input 'image' has {} frames; {} encodes 1 + {} k frames (the first frame, then "
                                     "chunks of {}), e.g. {} or {}",
                                     frames, info_.cls, t, t, below, below + t),
                         true);
    }
    auto one = [&](const at::Tensor& slice) { return encode_videos(slice, trace); };
    const at::Tensor moments = switches_.slicing ? sliced_apply(videos, one) : one(videos);
    auto parts = moments.chunk(2, 1);
    TensorMap out;
    out["mean"] = parts[0].contiguous();
    out["std"] = at::exp(at::clamp(parts[1], -30.0, 20.0) * 0.5);
    return out;
  }
  const at::Tensor images = image_batch(image, "image", info_.sample_channels);
  auto one = [&](const at::Tensor& slice) { return encode_images(slice, trace); };
  const at::Tensor moments = switches_.slicing ? sliced_apply(images, one) : one(images);
  // DiagonalGaussianDistribution: mean, logvar = chunk(moments, 2, dim=1).
  auto parts = moments.chunk(2, 1);
  at::Tensor mean = parts[0].contiguous();
  at::Tensor sd = at::exp(at::clamp(parts[1], -30.0, 20.0) * 0.5);
  TensorMap out;
  out["mean"] = info_.frame_axis ? mean.unsqueeze(2) : mean;
  out["std"] = info_.frame_axis ? sd.unsqueeze(2) : sd;
  return out;
}

}  // namespace tprun::models
