#include "models/vae_tiling.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::models {

namespace {

// b's first `extent` rows (dim 2) or columns (dim 3) become a linear blend
// from a's last ones into b's, in place, as diffusers' blend_v / blend_h.
void blend(const at::Tensor& a, at::Tensor& b, int64_t dim, int64_t extent) {
  extent = std::min({a.size(dim), b.size(dim), extent});
  for (int64_t y = 0; y < extent; ++y) {
    const double w = static_cast<double>(y) / static_cast<double>(extent);
    at::Tensor dst = b.select(dim, y);
    dst.copy_(a.select(dim, a.size(dim) - extent + y) * (1 - w) + dst * w);
  }
}

}  // namespace

bool needs_tiles(const at::Tensor& x, const VaeTiles& t) { return x.size(2) > t.in_tile || x.size(3) > t.in_tile; }

at::Tensor tiled_apply(const at::Tensor& x, const VaeTiles& t, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (t.in_tile < 1 || t.out_tile < 1 || !(t.overlap >= 0 && t.overlap < 1)) {
    throw ConfigError(fmt::format("VAE tiling: tiles of {} -> {} with overlap {} are not usable", t.in_tile,
                                  t.out_tile, t.overlap));
  }
  // Python's int() of a positive float: truncation.
  const auto stride = static_cast<int64_t>(static_cast<double>(t.in_tile) * (1 - t.overlap));
  const auto extent = static_cast<int64_t>(static_cast<double>(t.out_tile) * t.overlap);
  const int64_t limit = t.out_tile - extent;
  if (stride < 1 || limit < 1) {
    throw ConfigError(fmt::format("VAE tiling: a tile of {} with overlap {} leaves no stride", t.in_tile, t.overlap));
  }
  return tiled_apply_grid(x, VaeTileGrid{t.in_tile, stride, extent, limit}, f);
}

at::Tensor tiled_apply_grid(const at::Tensor& x, const VaeTileGrid& g,
                            const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (g.in_tile < 1 || g.in_stride < 1 || g.blend < 0 || g.crop < 1) {
    throw ConfigError(fmt::format("VAE tiling: tiles of {} at steps of {} (blend {}, crop {}) are not usable",
                                  g.in_tile, g.in_stride, g.blend, g.crop));
  }
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < x.size(2); i += g.in_stride) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < x.size(3); j += g.in_stride) {
      const at::Tensor tile =
          x.slice(2, i, std::min(i + g.in_tile, x.size(2))).slice(3, j, std::min(j + g.in_tile, x.size(3)));
      row.push_back(f(tile.contiguous()).contiguous());
    }
    rows.push_back(std::move(row));
  }
  std::vector<at::Tensor> out_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> out_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& tile = rows[i][j];
      if (i > 0) blend(rows[i - 1][j], tile, 2, g.blend);
      if (j > 0) blend(rows[i][j - 1], tile, 3, g.blend);
      out_row.push_back(tile.slice(2, 0, std::min(g.crop, tile.size(2))).slice(3, 0, std::min(g.crop, tile.size(3))));
    }
    out_rows.push_back(at::cat(out_row, 3));
  }
  return at::cat(out_rows, 2);
}

at::Tensor sliced_apply(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (x.size(0) <= 1) return f(x);
  std::vector<at::Tensor> parts;
  for (int64_t b = 0; b < x.size(0); ++b) parts.push_back(f(x.slice(0, b, b + 1)));
  return at::cat(parts, 0);
}

}  // namespace tprun::models
