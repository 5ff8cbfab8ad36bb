#pragma once
// FLUX.2 latents as Flux2Pipeline / Flux2KleinPipeline prepare them. Unlike
// FLUX.1 the noise is drawn directly in the 2x2-patchified shape and the
// tokens carry 4-axis position ids (t, h, w, l):
//   noise     seeded_noise(seed, [B, in_channels, H/16, W/16]) (pipelines/latents.h:
//             torch's CPU generator, the same noise as diffusers for a seed)
//   pack      [B, C, h, w] -> [B, h*w, C] (channels last, row-major tokens)
//   image ids (0, row, col, 0) for row < h, col < w; text ids (0, 0, 0, l)
//   schedule  sigmas linspace(1, 1/n, n) shifted with mu = compute_empirical_mu(h*w, n)
//   decode    unpack, z * sqrt(bn.running_var + eps) + bn.running_mean (the VAE's
//             latent statistics), unpatchify [B, 4C, h, w] -> [B, C, 2h, 2w], VAE decode.

#include <cstdint>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace at {
class Tensor;
}

namespace tprun::pipelines {

// diffusers' compute_empirical_mu(image_seq_len, num_steps) (float64 arithmetic).
double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps);

// [B, C, h, w] -> [B, h*w, C].
at::Tensor flux2_pack(const at::Tensor& latents);
// [B, h*w, C] -> [B, C, h, w]. Internal error when the token count is not h*w.
at::Tensor flux2_unpack(const at::Tensor& packed, int64_t h, int64_t w);
// [B, 4C, h, w] -> [B, C, 2h, 2w] (_unpatchify_latents).
at::Tensor flux2_unpatchify(const at::Tensor& latents);

// [h*w, 4] ids (0, row, col, 0); [length, 4] text ids (0, 0, 0, l). float32 on `device`.
at::Tensor flux2_image_ids(int64_t h, int64_t w, c10::Device device = c10::Device(c10::kCPU));
at::Tensor flux2_text_ids(int64_t length, c10::Device device = c10::Device(c10::kCPU));

// Packed initial noise [batch, h*w, channels] for a height x width image
// (size checked as FLUX.1's: multiples of 2 x the VAE scale factor):
// h = height / (2 * vae_scale_factor), the same for w.
at::Tensor flux2_prepare_latents(uint64_t seed, int64_t batch, int64_t channels, int64_t height, int64_t width,
                                 c10::ScalarType dtype, c10::Device device, int64_t vae_scale_factor);

}  // namespace tprun::pipelines
