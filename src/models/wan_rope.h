#pragma once
// Wan's 3-D rotary position embedding (diffusers' WanRotaryPosEmbed, theta
// 10000), as the cos / sin tables nn::apply_rope rotates with.
//
// Each head of head_dim D is cut into three parts, in this order:
//   time    D - 4 floor(D / 6) channels
//   height  2 floor(D / 6)
//   width   2 floor(D / 6)
// (128 -> 44 / 42 / 42; 12 -> 4 / 4 / 4). Part a of d channels rotates its
// d/2 interleaved pairs (channels 2j, 2j+1) by the angle p_a * f_j with
// f_j = 1 / 10000^(2j / d) in fp64 and p_a the token's frame, row or column
// index (in patches, from 0); cos and sin are taken in fp64 and rounded to
// fp32 once, as diffusers' table is. Tokens are ordered frame-major, then
// row, then column (the order of the patch embedding's flatten).
//
// diffusers precomputes the table for positions 0 .. rope_max_seq_len - 1 and
// slices it per axis; a grid axis longer than that fails there on a shape
// error and is refused here instead (RequestError naming 'hidden_states').

#include <array>
#include <cstdint>

#include <c10/core/Device.h>

#include "models/nn_ops.h"

namespace tprun::models {

// (time, height, width) channels of one head of `head_dim` (even, >= 2).
std::array<int64_t, 3> wan_rope_dims(int64_t head_dim);

// The tables [frames * height * width, head_dim] fp32 on `device` for a grid
// of (frames, height, width) patches. RequestError naming input
// 'hidden_states' when an axis exceeds `max_positions` (rope_max_seq_len).
nn::Rope wan_rope(int64_t frames, int64_t height, int64_t width, int64_t head_dim, int64_t max_positions,
                  const at::Device& device);

}  // namespace tprun::models
