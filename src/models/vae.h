#pragma once
// What a pipeline needs of a VAE, whatever its class (AutoencoderKL,
// AutoencoderKLFlux2, AutoencoderKLQwenImage, AutoencoderKLWan):
//   Vae          the loaded model: decode, encode, latent normalisation,
//                spatial and temporal scale factors, slicing and tiling as
//                loaded, its compute dtype, its shape for the memory estimate
//   VaeInfo      the same facts read from config.json alone (no weight), for
//                the pipeline's load checks and the fit planner
//   VaeShape     what the per-request memory estimate needs of the decoder
// Each VAE class registers its config reader next to its model
// (TPRUN_REGISTER_VAE_INFO); a pipeline never names a VAE class.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "models/model_registry.h"
#include "models/vae_tiling.h"

namespace at {
class Tensor;
}

namespace tprun::memory {
struct MemoryOptions;
}

namespace tprun::models {

struct VaeShape {
  std::vector<int64_t> decoder_channels;  // per resolution level, lowest resolution first
  int64_t latent_channels = 16;
  int64_t scale_factor = 8;          // pixels per latent per side
  int64_t temporal_scale = 1;        // frames per latent frame (after the first); 1 for image VAEs
  int64_t elem_bytes = 4;            // the VAE's compute dtype (fp32 when upcast)
  bool scores_materialised = false;  // its attention backend builds the scores
  bool tiling = false;
  int64_t tile_sample = 0;           // tile side in pixels (tiling)
};

// A VAE config's facts, read without weights. CheckpointError naming the
// file and field as the class's from_json gives.
struct VaeInfo {
  std::string cls;                        // the config's _class_name
  int64_t latent_channels = 0;            // channels of one latent (before any packing)
  int64_t spatial_scale = 8;              // pixels per latent per side
  int64_t temporal_scale = 1;             // frames per latent frame after the first: 1 for image VAEs
                                          // and one-frame ones (AutoencoderKLQwenImage), 4 for AutoencoderKLWan
  int64_t default_tile_sample = 0;        // tile side (px) when [memory] vae_tile_sample_size is unset
  bool force_upcast = false;              // a 16-bit compute dtype runs this VAE in fp32
  int64_t sample_channels = 3;            // channels of the images it encodes
  bool frame_axis = false;                // latents and samples are [B, C, F, h, w] (3-D VAEs)
  std::vector<int64_t> decoder_channels;  // per level, lowest resolution first
};

// The VAE's compute dtype for a pipeline `dtype` ("fp32" under force_upcast
// with a 16-bit one, else `dtype`).
std::string vae_compute_dtype(const VaeInfo& info, const std::string& dtype);
// The memory estimate's shape of this VAE's decoder computing in
// `compute_dtype` on `device`, tiled as `memory` says.
VaeShape vae_shape(const VaeInfo& info, const std::string& compute_dtype, const std::string& device,
                   const memory::MemoryOptions& memory);

// A tile of `tile_sample` px at a stride of int(tile x (1 - overlap)) px must
// hold a latent and move by one (AutoencoderKLQwenImage's load; a pipeline
// also holds every VAE's tiles to whole latents first, pipelines/
// component_check.h): ConfigError naming `config_path` otherwise.
void check_vae_tile_stride(int64_t tile_sample, double overlap, int64_t scale_factor, const std::string& config_path);

using VaeInfoReader = std::function<VaeInfo(const nlohmann::json& config, const std::string& config_path)>;
// The registered reader of config's _class_name (CheckpointError naming the
// file, the class and the known ones for another class).
VaeInfo read_vae_info(const nlohmann::json& config, const std::string& config_path);

struct BuildOptions;  // models/model_builder.h

// What a VAE was loaded with, the same for every class: the part
// (ModelOptions::part: "" = both, "decoder", "encoder") and
// MemoryOptions::vae_slicing / vae_tiling / vae_tile_sample_size (0: the
// class's default tile) / vae_tile_overlap.
struct VaeSwitches {
  std::string part;
  bool slicing = false, tiling = false;
  int64_t tile_sample = 0;  // tile side in pixels
  double tile_overlap = 0.25;
};

class Vae : public Model {
 public:
  // Denormalized latents in the layout this VAE decodes, on any device /
  // dtype (moved to the VAE's) -> samples in compute_dtype():
  //   image VAEs: [B, C, h, w] -> [B, S, H, W] (S the image channels, 3),
  //     not clamped;
  //   one-frame VAEs with a frame axis (temporal_scale 1:
  //     AutoencoderKLQwenImage): [B, C, 1, h, w] or [B, C, h, w] ->
  //     [B, S, 1, H, W];
  //   video VAEs (temporal_scale T > 1: AutoencoderKLWan): [B, C, F, h, w]
  //     (or [B, C, h, w], one frame) -> [B, S, 1 + T (F - 1), H, W].
  // The batch one item (image or video) at a time when slicing; each item
  // tiled when tiling and larger than a tile (a video's tiles span all its
  // frames).
  // RequestError naming 'z' for another layout or channel count; ConfigError
  // when loaded without the decoder.
  at::Tensor decode(const at::Tensor& z, Trace* trace = nullptr) const;
  // Samples in [-1, 1], laid out as decode's output (a video VAE's frame
  // count 1 + T k) -> {"mean", "std"} of the latent distribution, laid out
  // as decode's input; sliced and tiled alike.
  // RequestError naming 'image'; ConfigError when loaded without the encoder.
  TensorMap encode(const at::Tensor& image, Trace* trace = nullptr) const;

  // How decode(z) of one slice (z as decode takes it: the whole batch, or
  // one item when slicing) runs when it is tiled, for a decode that spreads
  // the tiles over ranks (vae_split_decode.h): decode(z) equals
  // finish(blend_grid(tile(contiguous input tile) for each of
  // grid_tiles(input, grid))). std::nullopt when decode(z) does not tile it
  // (tiling off, z within one tile, or a class that does not describe its
  // tiles: AutoencoderKL, AutoencoderKLFlux2; AutoencoderKLQwenImage and
  // AutoencoderKLWan do).
  // RequestError / ConfigError as decode.
  struct TiledDecode {
    at::Tensor input;  // z checked, on the VAE's device and dtype, in the layout the grid cuts
    VaeTileGrid grid;
    std::function<at::Tensor(const at::Tensor&)> tile;    // one input tile -> its samples
    std::function<at::Tensor(const at::Tensor&)> finish;  // the blended grid -> decode(z)
  };
  virtual std::optional<TiledDecode> tiled_decode(const at::Tensor& z) const;
  // The pipeline's latent normalisation undone / applied, computed in z's
  // dtype on z's device. `z` is in the layout this VAE's statistics describe:
  // AutoencoderKL [B, C, h, w] (z / scaling_factor + shift_factor);
  // AutoencoderKLFlux2 the 2x2-patchified [B, 4C, h/2, w/2] (batch-norm
  // statistics); AutoencoderKLQwenImage [B, C, F, h, w] (latents_mean / _std).
  // RequestError naming 'z' for another layout.
  virtual at::Tensor denormalize(const at::Tensor& z) const = 0;
  virtual at::Tensor normalize(const at::Tensor& z) const = 0;

  // {"latents"} -> {"sample"} (decode) or {"image"} -> {"mean", "std"}
  // (encode); RequestError unless exactly one of them is given.
  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const final;
  // "sample" with the decoder loaded, else "mean".
  std::string primary_output() const final;
  // With the decoder: {"latents"} of 4 x 4 latents (one frame when
  // info().frame_axis), else {"image"} of (4 x spatial_scale)^2 pixels in
  // [-1, 1]; batch 1, fp32, drawn from `seed` on the CPU.
  TensorMap example_inputs(uint64_t seed) const override;

  const VaeInfo& info() const { return info_; }
  int64_t latent_channels() const { return info().latent_channels; }
  int64_t spatial_scale() const { return info().spatial_scale; }
  int64_t temporal_scale() const { return info().temporal_scale; }
  // "fp32" when upcast, else the requested dtype (its canonical name).
  const std::string& compute_dtype() const { return compute_dtype_; }
  // MemoryOptions::vae_slicing / vae_tiling as loaded; the tile side in pixels.
  bool slicing() const { return switches_.slicing; }
  bool tiling() const { return switches_.tiling; }
  int64_t tile_sample_size() const { return switches_.tile_sample; }
  double tile_overlap() const { return switches_.tile_overlap; }
  bool has_decoder() const { return loaded_ && switches_.part != "encoder"; }
  bool has_encoder() const { return loaded_ && switches_.part != "decoder"; }
  // The device it was loaded on (ModelOptions::device: "cpu", "cuda:0").
  const std::string& device() const { return device_; }
  // This loaded decoder's shape for the memory estimate on `device`.
  VaeShape memory_shape(const std::string& device) const;

 protected:
  // A load's first step, one for every class: `info` kept, the compute dtype
  // (vae_compute_dtype: ConfigError naming 'dtype'), the part checked
  // (ConfigError naming the class) and the switches read from options.memory.
  void init_vae(VaeInfo info, const ModelOptions& options);
  // The build options of the loaded part: build_options(options) in
  // compute_dtype(), reading only that part's tensors.
  BuildOptions part_build_options(const ModelOptions& options) const;
  // The last step: the built table and byte counts kept, the part marked loaded.
  void finish_load(ModelTable table, uint64_t bytes_read, uint64_t bytes_stored);
  // `table` (the whole model) with the tensors a load of `part` never reads
  // optional: encoder.* + quant_conv.* for "decoder", decoder.* +
  // post_quant_conv.* for "encoder" (any other tensor goes with both).
  static void mark_other_part_optional(ModelTable& table, const std::string& part);
  // x as [B, channels, H, W] (a frame-axis VAE's one frame squeezed);
  // RequestError naming the input otherwise.
  at::Tensor image_batch(const at::Tensor& x, const char* name, int64_t channels) const;
  // x as [B, channels, F, H, W] (a 4-D x as one frame): a video VAE's input;
  // RequestError naming the input otherwise.
  at::Tensor video_batch(const at::Tensor& x, const char* name, int64_t channels) const;

 private:
  // The class's decode / encode of one slice of images ([b, C, h, w] /
  // [b, sample_channels, H, W], checked): tiled when tiling and larger than
  // a tile; encode_images returns the moments cat(mean, logvar) on dim 1.
  virtual at::Tensor decode_images(const at::Tensor& z, Trace* trace) const = 0;
  virtual at::Tensor encode_images(const at::Tensor& image, Trace* trace) const = 0;
  // A video VAE's (temporal_scale > 1) decode / encode of one slice of
  // videos ([b, C, F, h, w] / [b, sample_channels, 1 + T k, H, W], checked),
  // tiled likewise; encode_videos returns cat(mean, logvar) on dim 1. Other
  // classes never get these calls (an internal error if they did).
  virtual at::Tensor decode_videos(const at::Tensor& z, Trace* trace) const;
  virtual at::Tensor encode_videos(const at::Tensor& image, Trace* trace) const;

  VaeInfo info_;
  std::string compute_dtype_ = "fp32";
  VaeSwitches switches_;
  std::string device_ = "cpu";
  bool loaded_ = false;
};

namespace detail {
bool register_vae_info(const char* cls, VaeInfoReader reader);
}

}  // namespace tprun::models

// Next to the VAE's model registration: TPRUN_REGISTER_VAE_INFO("AutoencoderKL", fn);
#define TPRUN_REGISTER_VAE_INFO(name, fn)                                                           \
  static const bool TPRUN_MODEL_CONCAT(tprun_vae_info_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::models::detail::register_vae_info(name, fn)
