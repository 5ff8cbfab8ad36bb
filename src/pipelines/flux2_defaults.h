#pragma once
// What FLUX.2's pipelines fix besides their configs, in one place for the
// pipeline (flux2_pipeline.cpp) and its layout for the fit planner
// (flux2_layout.cpp), which must agree.

#include <cstdint>
#include <vector>

#include "pipelines/pipeline.h"

namespace tprun::pipelines {

// The text encoder's hidden layers each pipeline stacks (text_encoder_out_layers):
// klein 9, 18, 27; dev 10, 20, 30.
std::vector<int64_t> flux2_stacked_layers(bool klein);

// Flux2Pipeline's / Flux2KleinPipeline's __call__ defaults: 128 latent pixels
// x the VAE scale factor square, 50 steps, guidance 4.0, 512 text tokens.
GenerationRequest flux2_defaults(int64_t vae_scale_factor);

}  // namespace tprun::pipelines
