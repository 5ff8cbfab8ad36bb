#pragma once
// What a pipeline needs of a VAE, whatever its class (AutoencoderKL,
// AutoencoderKLFlux2, AutoencoderKLQwenImage; AutoencoderKLWan next):
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
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "models/model_registry.h"

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
  int64_t temporal_scale = 1;             // 1 for image VAEs
  int64_t default_tile_sample = 0;        // tile side (px) when [memory] vae_tile_sample_size is unset
  bool force_upcast = false;              // a 16-bit compute dtype runs this VAE in fp32
  std::vector<int64_t> decoder_channels;  // per level, lowest resolution first
};

// The VAE's compute dtype for a pipeline `dtype` ("fp32" under force_upcast
// with a 16-bit one, else `dtype`).
std::string vae_compute_dtype(const VaeInfo& info, const std::string& dtype);
// The memory estimate's shape of this VAE's decoder computing in
// `compute_dtype` on `device`, tiled as `memory` says.
VaeShape vae_shape(const VaeInfo& info, const std::string& compute_dtype, const std::string& device,
                   const memory::MemoryOptions& memory);

using VaeInfoReader = std::function<VaeInfo(const nlohmann::json& config, const std::string& config_path)>;
// The registered reader of config's _class_name (CheckpointError naming the
// file, the class and the known ones for another class).
VaeInfo read_vae_info(const nlohmann::json& config, const std::string& config_path);

class Vae : public Model {
 public:
  // Normalised latents in the layout this VAE decodes ([B, C, h, w] image
  // VAEs; [B, C, F, h, w] 3-D ones), moved to the VAE's device and dtype by
  // the caller -> samples [B, 3, H, W] / [B, 3, F', H, W] in [-1, 1] (not
  // clamped by image VAEs), in compute_dtype().
  virtual at::Tensor decode(const at::Tensor& z, Trace* trace = nullptr) const = 0;
  // Samples in [-1, 1] -> {"mean", "std"} of the latent distribution.
  virtual TensorMap encode(const at::Tensor& image, Trace* trace = nullptr) const = 0;
  // The pipeline's latent normalisation undone / applied, computed in z's
  // dtype on z's device. `z` is in the layout this VAE's statistics describe:
  // AutoencoderKL [B, C, h, w] (z / scaling_factor + shift_factor);
  // AutoencoderKLFlux2 the 2x2-patchified [B, 4C, h/2, w/2] (batch-norm
  // statistics); AutoencoderKLQwenImage [B, C, F, h, w] (latents_mean / _std).
  virtual at::Tensor denormalize(const at::Tensor& z) const = 0;
  virtual at::Tensor normalize(const at::Tensor& z) const = 0;

  virtual const VaeInfo& info() const = 0;
  int64_t latent_channels() const { return info().latent_channels; }
  int64_t spatial_scale() const { return info().spatial_scale; }
  int64_t temporal_scale() const { return info().temporal_scale; }
  // "fp32" when upcast, else the requested dtype.
  virtual const std::string& compute_dtype() const = 0;
  // MemoryOptions::vae_slicing / vae_tiling as loaded; the tile side in pixels.
  virtual bool slicing() const = 0;
  virtual bool tiling() const = 0;
  virtual int64_t tile_sample_size() const = 0;
  virtual bool has_decoder() const = 0;
  virtual bool has_encoder() const = 0;
  // This loaded decoder's shape for the memory estimate on `device`.
  VaeShape memory_shape(const std::string& device) const;
};

namespace detail {
bool register_vae_info(const char* cls, VaeInfoReader reader);
}

}  // namespace tprun::models

// Next to the VAE's model registration: TPRUN_REGISTER_VAE_INFO("AutoencoderKL", fn);
#define TPRUN_REGISTER_VAE_INFO(name, fn)                                                           \
  static const bool TPRUN_MODEL_CONCAT(tprun_vae_info_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::models::detail::register_vae_info(name, fn)
