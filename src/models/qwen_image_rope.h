#pragma once
// Qwen-Image's rotary position embedding (diffusers' QwenEmbedRope with
// scale_rope, theta 10000), as cos / sin tables over the joint [text, image]
// token order that nn::apply_rope rotates with.
//
// Each token has three positions, one per RoPE axis (axes_dims_rope, e.g.
// 16 / 56 / 56 of head_dim 128). Axis a with dim d rotates d/2 pairs of
// channels (interleaved: channels 2j and 2j+1) by the angle p * f_j with
// f_j = 1 / 10000^(2j / d); the angles, cosines and sines are computed in
// fp32 exactly as diffusers' table (rope_params: fp32 frequencies, fp32
// product, torch.polar). diffusers multiplies the channel pairs by the
// complex exponential, which is the same rotation as x * cos + rot(x) * sin.
//
// Image tokens. One sample holds images k = 0 .. N-1 of (frames, height,
// width) patches each, flattened frame-major, then row, then column, image
// after image. Image k's token at (f, r, c) has positions
//   (k + f,  r - ceil(height / 2),  c - ceil(width / 2))
// i.e. rows and columns centred on 0 (scale_rope: negatives on the top /
// left half). Text tokens. Text token j has position m + j on every axis,
// with m = max over images of max(height / 2, width / 2) (integer halves):
// the text sits diagonally after the image's largest positive index.
// diffusers keeps a table of 4096 positive (0 .. 4095) and 4096 negative
// (-4096 .. -1) positions; a position outside it is refused here
// (diffusers would fail on a shape mismatch).
//
// diffusers computes the table from the FIRST sample's image shapes and
// uses it for the whole batch; tprun requires all samples to share them
// (qwen_image_transformer.cpp).

#include <array>
#include <cstdint>
#include <vector>

#include <c10/core/Device.h>

#include "models/nn_ops.h"

namespace tprun::models {

// (frames, height, width) of one image, in patches.
using QwenImageShape = std::array<int64_t, 3>;

// The largest index of diffusers' position tables (4096 entries each way).
constexpr int64_t kQwenRopePositions = 4096;

// Tokens of the images of one sample: sum of frames * height * width.
int64_t qwen_image_tokens(const std::vector<QwenImageShape>& images);

// The cos / sin tables [text_tokens + image tokens, sum(axes_dims)] fp32 on
// `device` ("cpu", "cuda:0"), text first. RequestError naming input
// 'img_shapes' when a position falls outside diffusers' tables.
nn::Rope qwen_image_rope(const std::vector<QwenImageShape>& images, int64_t text_tokens,
                         const std::vector<int64_t>& axes_dims, const at::Device& device);

}  // namespace tprun::models
