#pragma once
// FLUX.1 latents as FluxPipeline prepares them: seeded initial noise, the 2x2
// packing of latents into tokens and back, the image-token position ids, and
// the check of the requested image size.
//
// Noise generator (documented contract): the noise of a request is drawn on
// the CPU from a fresh at::CPUGeneratorImpl seeded with the request's seed
// (mt19937, torch's CPU generator), by at::randn of the latent shape
// [batch, channels, h, w] in the requested dtype, then moved to the device.
// That is exactly torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed),
// dtype=dtype) followed by .to(device), which is what diffusers' randn_tensor
// does in FluxPipeline.prepare_latents when given a CPU generator. So a seed
// gives the same latents on any device, tp and dp, and the same latents as
// diffusers with a CPU generator. Note that torch's CPU randn draws bf16/fp16
// directly in that dtype (a different sequence from fp32 randn rounded to
// bf16), and so does this, to stay equal to diffusers at every dtype.

#include <cstdint>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace at {
class Tensor;
}

namespace tprun::pipelines {

// Every function here takes the VAE's scale factor (models::Vae::spatial_scale,
// from its config): no family's factor is assumed.

// RequestError "height 1000 is not a multiple of 16 (...)" unless height and
// width are positive multiples of vae_scale_factor * 2 (the VAE's factor times
// the 2x2 packing). diffusers only warns and rounds down; tprun refuses.
void check_image_size(int64_t height, int64_t width, int64_t vae_scale_factor);

// Latent (unpacked) height or width for an image side: 2 * (side / (vae_scale_factor * 2)).
int64_t latent_side(int64_t image_side, int64_t vae_scale_factor);

// Packed sequence length (number of image tokens) = (latent h / 2) * (latent w / 2);
// what FluxPipeline passes to calculate_shift.
int64_t image_seq_len(int64_t height, int64_t width, int64_t vae_scale_factor);

// Standard normal noise of `shape` from the seeded CPU generator (see above).
at::Tensor seeded_noise(uint64_t seed, const std::vector<int64_t>& shape, c10::ScalarType dtype,
                        c10::Device device);

// [B, C, H, W] -> [B, (H/2) * (W/2), 4C]: FluxPipeline._pack_latents. H and W even.
at::Tensor pack_latents(const at::Tensor& latents);

// [B, N, 4C] -> [B, C, h, w] with h, w = latent_side(height, width): FluxPipeline._unpack_latents.
// Error (internal) when N or the channels do not fit.
at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width,
                          int64_t vae_scale_factor);

// [rows * cols, 3] with row r * cols + c = (0, r, c), built in fp32 then cast:
// FluxPipeline._prepare_latent_image_ids(batch, latent h / 2, latent w / 2).
at::Tensor latent_image_ids(int64_t rows, int64_t cols, c10::ScalarType dtype = c10::kFloat,
                            c10::Device device = c10::Device(c10::kCPU));

// FluxPipeline.prepare_latents without given latents: checks the size, draws
// seeded_noise(seed, [batch, channels, h, w]) and packs it. channels = the
// transformer's in_channels / 4 (16 for FLUX.1).
at::Tensor prepare_latents(uint64_t seed, int64_t batch, int64_t channels, int64_t height, int64_t width,
                           c10::ScalarType dtype, c10::Device device,
                           int64_t vae_scale_factor);

}  // namespace tprun::pipelines
