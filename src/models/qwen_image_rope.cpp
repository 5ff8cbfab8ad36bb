// QwenEmbedRope's positions and tables (see qwen_image_rope.h).
#include "models/qwen_image_rope.h"

#include <algorithm>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/stack.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::models {
namespace {

void refuse_position(const std::string& what, int64_t needed) {
  throw RequestError(fmt::format("input 'img_shapes': {} needs RoPE position {} but Qwen-Image's tables hold "
                                 "positions -{} .. {}",
                                 what, needed, kQwenRopePositions, kQwenRopePositions - 1),
                     true);
}

// Positions [tokens, 3] (fp32) of one image's tokens, frame-major then row then column.
at::Tensor image_positions(const QwenImageShape& s, int64_t index) {
  const auto [frames, height, width] = s;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor t = at::arange(frames * height * width, i64);
  const at::Tensor f = t.div(height * width, "floor") + index;
  const at::Tensor r = t.div(width, "floor").remainder(height) - (height - height / 2);
  const at::Tensor c = t.remainder(width) - (width - width / 2);
  return at::stack({f, r, c}, 1).to(at::kFloat);
}

}  // namespace

int64_t qwen_image_tokens(const std::vector<QwenImageShape>& images) {
  int64_t n = 0;
  for (const auto& s : images) n += s[0] * s[1] * s[2];
  return n;
}

nn::Rope qwen_image_rope(const std::vector<QwenImageShape>& images, int64_t text_tokens,
                         const std::vector<int64_t>& axes_dims, const at::Device& device) {
  // Bounds of diffusers' tables (pos 0 .. 4095, neg -4096 .. -1).
  int64_t text_start = 0;
  std::vector<at::Tensor> parts;
  for (size_t k = 0; k < images.size(); ++k) {
    const auto [frames, height, width] = images[k];
    const auto idx = static_cast<int64_t>(k);
    if (idx + frames > kQwenRopePositions) refuse_position(fmt::format("image {} with {} frames", k, frames), idx + frames - 1);
    if (height - height / 2 > kQwenRopePositions || width - width / 2 > kQwenRopePositions) {
      refuse_position(fmt::format("image {} of {} x {} patches", k, height, width),
                      -std::max(height - height / 2, width - width / 2));
    }
    text_start = std::max({text_start, height / 2, width / 2});
  }
  if (text_start + text_tokens > kQwenRopePositions) {
    refuse_position(fmt::format("{} text tokens after image index {}", text_tokens, text_start),
                    text_start + text_tokens - 1);
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  parts.push_back(at::arange(text_tokens, f32).unsqueeze(1).expand({text_tokens, 3}) + static_cast<double>(text_start));
  for (size_t k = 0; k < images.size(); ++k) parts.push_back(image_positions(images[k], static_cast<int64_t>(k)));
  const at::Tensor pos = at::cat(parts, 0);  // [S, 3] fp32, [text, image]

  std::vector<at::Tensor> cos_parts, sin_parts;
  for (size_t a = 0; a < axes_dims.size(); ++a) {
    const int64_t d = axes_dims[a];
    // rope_params in fp32: 1 / 10000^(arange(0, d, 2) / d), then position * frequency.
    const at::Tensor exponent = at::arange(0, d, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
                                static_cast<double>(d);
    const at::Tensor freqs = 1.0 / at::pow(10000.0, exponent);
    const at::Tensor angles = at::outer(pos.select(1, static_cast<int64_t>(a)).contiguous(), freqs);
    cos_parts.push_back(at::cos(angles).repeat_interleave(2, 1));
    sin_parts.push_back(at::sin(angles).repeat_interleave(2, 1));
  }
  nn::Rope rope;
  rope.cos = std::make_shared<at::Tensor>(at::cat(cos_parts, -1).to(device));
  rope.sin = std::make_shared<at::Tensor>(at::cat(sin_parts, -1).to(device));
  return rope;
}

}  // namespace tprun::models
