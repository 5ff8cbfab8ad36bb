// diffusers' tiling of the causal 3-D VAEs (causal_vae_tiling.h).
#include "models/causal_vae_tiling.h"

#include <ATen/core/Tensor.h>

#include "models/vae.h"

namespace tprun::models {

CausalVaeTiling CausalVaeTiling::of(bool on, int64_t sample, double overlap, int64_t scale,
                                    const std::string& config_path) {
  CausalVaeTiling t;
  t.on = on;
  t.sample = sample;
  t.stride = static_cast<int64_t>(static_cast<double>(sample) * (1 - overlap));
  t.scale = scale;
  if (on) check_vae_tile_stride(sample, overlap, scale, config_path);
  return t;
}

std::optional<VaeTileGrid> CausalVaeTiling::decode_grid(const at::Tensor& z) const {
  const int64_t tile = sample / scale;
  if (!on || (z.size(-2) <= tile && z.size(-1) <= tile)) return std::nullopt;
  return VaeTileGrid{tile, stride / scale, sample - stride, stride};
}

at::Tensor CausalVaeTiling::encode(const at::Tensor& x, Trace* trace,
                                   const std::function<at::Tensor(const at::Tensor&, Trace*)>& encode_tile) const {
  if (!on || (x.size(-2) <= sample && x.size(-1) <= sample)) return encode_tile(x, trace);
  const int64_t latent_stride = stride / scale;
  const VaeTileGrid grid{sample, stride, sample / scale - latent_stride, latent_stride};
  const at::Tensor out = tiled_apply_grid(x, grid, [&](const at::Tensor& t) { return encode_tile(t, nullptr); });
  return out.slice(-2, 0, x.size(-2) / scale).slice(-1, 0, x.size(-1) / scale);
}

}  // namespace tprun::models
