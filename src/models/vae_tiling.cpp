#include "models/vae_tiling.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::models {

namespace {

// b's first `extent` rows or columns (dim `dim`) become a linear blend
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

std::vector<std::vector<at::Tensor>> grid_tiles(const at::Tensor& x, const VaeTileGrid& g) {
  if (g.in_tile < 1 || g.in_stride < 1 || g.blend < 0 || g.crop < 1) {
    throw ConfigError(fmt::format("VAE tiling: tiles of {} at steps of {} (blend {}, crop {}) are not usable",
                                  g.in_tile, g.in_stride, g.blend, g.crop));
  }
  const int64_t hd = x.dim() - 2, wd = x.dim() - 1;  // rows, columns
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < x.size(hd); i += g.in_stride) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < x.size(wd); j += g.in_stride) {
      row.push_back(
          x.slice(hd, i, std::min(i + g.in_tile, x.size(hd))).slice(wd, j, std::min(j + g.in_tile, x.size(wd))));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

at::Tensor blend_grid(std::vector<std::vector<at::Tensor>>& rows, const VaeTileGrid& g) {
  std::vector<at::Tensor> out_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> out_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& tile = rows[i][j];
      const int64_t hd = tile.dim() - 2, wd = tile.dim() - 1;
      if (i > 0) blend(rows[i - 1][j], tile, hd, g.blend);
      if (j > 0) blend(rows[i][j - 1], tile, wd, g.blend);
      out_row.push_back(
          tile.slice(hd, 0, std::min(g.crop, tile.size(hd))).slice(wd, 0, std::min(g.crop, tile.size(wd))));
    }
    out_rows.push_back(at::cat(out_row, out_row.front().dim() - 1));
  }
  return at::cat(out_rows, out_rows.front().dim() - 2);
}

at::Tensor tiled_apply_grid(const at::Tensor& x, const VaeTileGrid& g,
                            const std::function<at::Tensor(const at::Tensor&)>& f) {
  std::vector<std::vector<at::Tensor>> rows = grid_tiles(x, g);
  for (auto& row : rows) {
    for (auto& tile : row) tile = f(tile.contiguous()).contiguous();
  }
  return blend_grid(rows, g);
}

at::Tensor sliced_apply(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (x.size(0) <= 1) return f(x);
  std::vector<at::Tensor> parts;
  for (int64_t b = 0; b < x.size(0); ++b) parts.push_back(f(x.slice(0, b, b + 1)));
  return at::cat(parts, 0);
}

}  // namespace tprun::models
