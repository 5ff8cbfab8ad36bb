#pragma once
// QwenImagePipeline's layout (pipeline_layout.h) and the VAE shape its
// memory estimate counts; the layout reader registers itself in
// qwen_image_layout.cpp.

#include <cstdint>
#include <string>

#include "pipelines/request_memory.h"

namespace tprun::models {
struct QwenImageVaeConfig;
}

namespace tprun::pipelines {

// The AutoencoderKLQwenImage decoder for the per-request estimate: its
// levels lowest resolution first (base_dim x reversed(dim_mult): an
// approximation of the Wan decoder, whose upsamplers halve the width before
// the next level), the latent channels and scale factor, the compute dtype
// (the pipeline's: this VAE has no force_upcast), the attention backend's
// scores on `device`, and diffusers' tiles for this class (tile_sample, 0 =
// its default 256 pixels).
VaeShape qwen_image_vae_shape(const models::QwenImageVaeConfig& config, const std::string& dtype,
                              const std::string& device, bool tiling, int64_t tile_sample);

}  // namespace tprun::pipelines
