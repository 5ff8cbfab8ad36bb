// WanRotaryPosEmbed's tables for one latent grid (see wan_rope.h).
#include "models/wan_rope.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/stack.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::models {

std::array<int64_t, 3> wan_rope_dims(int64_t head_dim) {
  const int64_t side = 2 * (head_dim / 6);
  return {head_dim - 2 * side, side, side};
}

nn::Rope wan_rope(int64_t frames, int64_t height, int64_t width, int64_t head_dim, int64_t max_positions,
                  const at::Device& device) {
  if (frames > max_positions || height > max_positions || width > max_positions) {
    throw RequestError(fmt::format("input 'hidden_states': a grid of {} x {} x {} patches (frames, height, width) "
                                   "has an axis longer than rope_max_seq_len {}, the positions the model's rotary "
                                   "embedding covers",
                                   frames, height, width, max_positions),
                       true);
  }
  // Positions (f, r, c) of every token, frame-major; exact in fp32 (< 2^24).
  // Made on `device`, so the tables are computed there (no host copy per step).
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor f = at::arange(frames, f32).view({frames, 1, 1}).expand({frames, height, width});
  const at::Tensor r = at::arange(height, f32).view({1, height, 1}).expand({frames, height, width});
  const at::Tensor c = at::arange(width, f32).view({1, 1, width}).expand({frames, height, width});
  const at::Tensor ids = at::stack({f.reshape({-1}), r.reshape({-1}), c.reshape({-1})}, 1);
  const std::array<int64_t, 3> dims = wan_rope_dims(head_dim);
  return nn::rope_frequencies(ids, {dims[0], dims[1], dims[2]}, 10000.0);
}

}  // namespace tprun::models
