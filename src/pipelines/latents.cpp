#include "pipelines/latents.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

[[noreturn]] void internal(const std::string& message) { throw Error(Error::Kind::Internal, message); }

void check_factor(int64_t vae_scale_factor) {
  if (vae_scale_factor < 1) internal(fmt::format("vae_scale_factor {} must be at least 1", vae_scale_factor));
}

void check_side(const char* name, int64_t side, int64_t multiple) {
  if (side <= 0) throw RequestError(fmt::format("{} {} must be positive", name, side), true);
  if (side % multiple != 0) {
    // The next multiple up, unless that overflows (INT64_MAX suggested -9223372036854775808): then down.
    const int64_t down = side / multiple * multiple;
    const int64_t suggestion = down > INT64_MAX - multiple ? down : down + multiple;
    throw RequestError(fmt::format("{} {} is not a multiple of {} (the VAE's scale factor {} times the 2x2 "
                                   "latent packing); try {}",
                                   name, side, multiple, multiple / 2, suggestion),
                       true);
  }
}

}  // namespace

void check_image_size(int64_t height, int64_t width, int64_t vae_scale_factor) {
  check_factor(vae_scale_factor);
  check_side("height", height, vae_scale_factor * 2);
  check_side("width", width, vae_scale_factor * 2);
}

int64_t latent_side(int64_t image_side, int64_t vae_scale_factor) {
  check_factor(vae_scale_factor);
  return 2 * (image_side / (vae_scale_factor * 2));
}

int64_t image_seq_len(int64_t height, int64_t width, int64_t vae_scale_factor) {
  return (latent_side(height, vae_scale_factor) / 2) * (latent_side(width, vae_scale_factor) / 2);
}

at::Tensor seeded_noise(uint64_t seed, const std::vector<int64_t>& shape, c10::ScalarType dtype,
                        c10::Device device) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  at::Tensor noise = at::randn(shape, generator, at::TensorOptions().dtype(dtype).device(c10::kCPU));
  return noise.to(device);
}

at::Tensor pack_latents(const at::Tensor& latents) {
  if (latents.dim() != 4 || latents.size(2) % 2 != 0 || latents.size(3) % 2 != 0)
    internal(fmt::format("pack_latents needs [B, C, H, W] with H and W even, got [{}]",
                         fmt::join(latents.sizes().vec(), ", ")));
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2), w = latents.size(3);
  return latents.reshape({b, c, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({b, (h / 2) * (w / 2), c * 4});
}

at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width, int64_t vae_scale_factor) {
  const int64_t h = latent_side(height, vae_scale_factor), w = latent_side(width, vae_scale_factor);
  if (packed.dim() != 3 || packed.size(1) != (h / 2) * (w / 2) || packed.size(2) % 4 != 0)
    internal(fmt::format("unpack_latents of [{}] for a {}x{} image: needs [B, {}, 4C]",
                         fmt::join(packed.sizes().vec(), ", "), height, width, (h / 2) * (w / 2)));
  const int64_t b = packed.size(0), c = packed.size(2) / 4;
  return packed.reshape({b, h / 2, w / 2, c, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({b, c, h, w});
}

at::Tensor latent_image_ids(int64_t rows, int64_t cols, c10::ScalarType dtype, c10::Device device) {
  if (rows < 0 || cols < 0) internal(fmt::format("latent_image_ids of a {}x{} grid", rows, cols));
  std::vector<float> ids(static_cast<size_t>(rows * cols * 3), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto base = static_cast<size_t>((r * cols + c) * 3);
      ids[base + 1] = static_cast<float>(r);
      ids[base + 2] = static_cast<float>(c);
    }
  }
  return at::from_blob(ids.data(), {rows * cols, 3}, at::TensorOptions().dtype(at::kFloat))
      .to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor prepare_latents(uint64_t seed, int64_t batch, int64_t channels, int64_t height, int64_t width,
                           c10::ScalarType dtype, c10::Device device, int64_t vae_scale_factor) {
  check_image_size(height, width, vae_scale_factor);
  if (batch < 1 || channels < 1)
    internal(fmt::format("prepare_latents with batch {} and channels {}", batch, channels));
  const int64_t h = latent_side(height, vae_scale_factor), w = latent_side(width, vae_scale_factor);
  return pack_latents(seeded_noise(seed, {batch, channels, h, w}, dtype, device));
}

}  // namespace tprun::pipelines
