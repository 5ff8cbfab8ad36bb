#include "pipelines/flux2_latents.h"

#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>

#include "pipelines/latents.h"
#include "runtime/error.h"

namespace tprun::pipelines {

double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  const double seq = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) return a2 * seq + b2;
  const double m_200 = a2 * seq + b2;
  const double m_10 = a1 * seq + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * static_cast<double>(num_steps) + b;
}

at::Tensor flux2_pack(const at::Tensor& latents) {
  const int64_t b = latents.size(0), c = latents.size(1);
  return latents.reshape({b, c, latents.size(2) * latents.size(3)}).permute({0, 2, 1});
}

at::Tensor flux2_unpack(const at::Tensor& packed, int64_t h, int64_t w) {
  if (packed.dim() != 3 || packed.size(1) != h * w) {
    throw Error(Error::Kind::Internal,
                fmt::format("flux2_unpack: {} tokens do not make a {} x {} grid", packed.dim() == 3 ? packed.size(1) : -1,
                            h, w));
  }
  return packed.permute({0, 2, 1}).reshape({packed.size(0), packed.size(2), h, w});
}

at::Tensor flux2_unpatchify(const at::Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1) / 4, h = x.size(2), w = x.size(3);
  return x.reshape({b, c, 2, 2, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({b, c, 2 * h, 2 * w});
}

at::Tensor flux2_image_ids(int64_t h, int64_t w, c10::Device device) {
  std::vector<float> ids(static_cast<size_t>(h * w * 4), 0.0f);
  for (int64_t r = 0; r < h; ++r) {
    for (int64_t c = 0; c < w; ++c) {
      float* row = &ids[static_cast<size_t>((r * w + c) * 4)];
      row[1] = static_cast<float>(r);
      row[2] = static_cast<float>(c);
    }
  }
  return at::from_blob(ids.data(), {h * w, 4}, at::TensorOptions().dtype(at::kFloat)).clone().to(device);
}

at::Tensor flux2_text_ids(int64_t length, c10::Device device) {
  at::Tensor ids = at::zeros({length, 4}, at::TensorOptions().dtype(at::kFloat));
  ids.select(1, 3).copy_(at::arange(length, at::TensorOptions().dtype(at::kFloat)));
  return ids.to(device);
}

at::Tensor flux2_prepare_latents(uint64_t seed, int64_t batch, int64_t channels, int64_t height, int64_t width,
                                 c10::ScalarType dtype, c10::Device device, int64_t vae_scale_factor) {
  check_image_size(height, width, vae_scale_factor);
  const int64_t h = latent_side(height, vae_scale_factor) / 2, w = latent_side(width, vae_scale_factor) / 2;
  return flux2_pack(seeded_noise(seed, {batch, channels, h, w}, dtype, device));
}

}  // namespace tprun::pipelines
