#pragma once
// diffusers' tiling of the causal 3-D VAEs (enable_tiling of
// AutoencoderKLQwenImage and AutoencoderKLWan, which differ from
// AutoencoderKL's VaeTiles, vae_tiling.h), shared by QwenImageVae
// (qwen_image_vae.h: single frames [b, C, H, W]) and WanVae (wan_vae.h:
// videos [b, C, F, H, W], every frame of a tile at once); the tiles are cut
// on the last two dims. Tiles of `sample` pixels at a stride of
// int(sample x (1 - overlap)) pixels (256 at 192 by default); in latents
// both divided (floor) by the spatial scale.
//   decode: latent tiles, blended over sample - stride pixels, cropped to
//           the stride (the caller crops the whole to 8h x 8w)
//   encode: pixel tiles, blended over sample/scale - stride/scale latents,
//           cropped to stride/scale; the whole cropped to H//scale x W//scale
// Internal to those two classes.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "models/tensor_map.h"
#include "models/vae_tiling.h"

namespace tprun::models {

struct CausalVaeTiling {
  bool on = false;       // MemoryOptions::vae_tiling
  int64_t sample = 256;  // tile side in pixels
  int64_t stride = 192;  // int(sample x (1 - overlap)) pixels
  int64_t scale = 8;     // pixels per latent, each side

  // The tiling of a VAE of spatial `scale`; ConfigError naming `config_path`
  // (check_vae_tile_stride) when `on` and the tiles are smaller than the
  // scale or the overlap leaves a latent stride of 0.
  static CausalVaeTiling of(bool on, int64_t sample, double overlap, int64_t scale, const std::string& config_path);

  // The decode's latent grid for z [..., h, w]; nullopt when tiling is off
  // or z fits one latent tile (sample / scale) on both sides.
  std::optional<VaeTileGrid> decode_grid(const at::Tensor& z) const;

  // The encode of x [..., H, W]: `encode_tile` over the pixel tiles (no
  // trace), blended and cropped as above, when tiling is on and x is larger
  // than a tile on either side; else encode_tile(x, trace).
  at::Tensor encode(const at::Tensor& x, Trace* trace,
                    const std::function<at::Tensor(const at::Tensor&, Trace*)>& encode_tile) const;
};

}  // namespace tprun::models
