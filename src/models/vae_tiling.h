#pragma once
// Tiled VAE decode and encode, as diffusers' AutoencoderKL.enable_tiling()
// does them: the input is cut into overlapping square tiles (stride
// in_tile x (1 - overlap), the last ones smaller), each tile goes through the
// coder alone, and each output tile is blended linearly into the one above
// and the one to its left over blend = out_tile x overlap rows / columns,
// then cropped to out_tile - blend and the crops concatenated. The blends
// run in diffusers' order and in place, so a tile blended into its
// neighbours is the blended one: the result equals diffusers' to the
// floating-point order of the coder itself. Peak activation memory is one
// tile's, whatever the image size.
//
// Sizes: in_tile / out_tile are (latent, sample) for decode and (sample,
// latent) for encode; diffusers takes sample = the config's sample_size and
// latent = sample / 2^(len(block_out_channels) - 1). Tiling applies when the
// input is larger than in_tile on either side (diffusers' test).

#include <cstdint>
#include <functional>
#include <vector>

namespace at {
class Tensor;
}

namespace tprun::models {

struct VaeTiles {
  int64_t in_tile = 0;   // tile side on the input (> 0)
  int64_t out_tile = 0;  // tile side on the output (> 0)
  double overlap = 0.25;  // [0, 1): share of a tile that overlaps the next
};

// True when `x` ([B, C, H, W]) is larger than one input tile on either side.
bool needs_tiles(const at::Tensor& x, const VaeTiles& tiles);

// f over the tiles of x, blended as above. ConfigError for tile sizes or an
// overlap that leave no stride.
at::Tensor tiled_apply(const at::Tensor& x, const VaeTiles& tiles,
                       const std::function<at::Tensor(const at::Tensor&)>& f);

// A tile grid given explicitly, as diffusers' AutoencoderKLQwenImage (and
// AutoencoderKLWan) tile: input tiles of in_tile at steps of in_stride (the
// last ones smaller); each output tile blended, in place and in diffusers'
// order, into the one above and the one to its left over `blend` rows /
// columns, cropped to its first `crop` rows / columns, the crops
// concatenated. The caller crops the whole to the output size (with a crop
// larger than the output stride the tiles' crops overlap, as diffusers'
// do). ConfigError for a grid with no step or no crop. The tiles are cut on
// the last two dims, so [B, C, H, W] images and [B, C, F, H, W] videos (every
// frame of a tile at once, as AutoencoderKLWan) alike.
struct VaeTileGrid {
  int64_t in_tile = 0;    // input tile side (> 0)
  int64_t in_stride = 0;  // input step (> 0)
  int64_t blend = 0;      // output rows / columns blended (>= 0)
  int64_t crop = 0;       // output rows / columns kept per tile (> 0)
};
at::Tensor tiled_apply_grid(const at::Tensor& x, const VaeTileGrid& grid,
                            const std::function<at::Tensor(const at::Tensor&)>& f);
// tiled_apply_grid's two halves, for callers that run the tiles elsewhere
// (vae_split_decode.h): the input tiles row by row (views of x; ConfigError
// as above), and the output tiles (f of each, contiguous) blended in place,
// cropped and concatenated.
std::vector<std::vector<at::Tensor>> grid_tiles(const at::Tensor& x, const VaeTileGrid& grid);
at::Tensor blend_grid(std::vector<std::vector<at::Tensor>>& out_tiles, const VaeTileGrid& grid);

// f over x one image at a time (diffusers' enable_slicing), concatenated on
// dim 0; a batch of one is f(x).
at::Tensor sliced_apply(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f);

}  // namespace tprun::models
