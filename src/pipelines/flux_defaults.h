#pragma once
// FluxPipeline's __call__ defaults, in one place for the pipeline
// (flux_pipeline.cpp) and its layout for the fit planner (flux_layout.cpp).

#include <cstdint>

#include "pipelines/pipeline.h"

namespace tprun::pipelines {

// 128 latent pixels x the VAE scale factor square, 28 steps, guidance 3.5,
// true_cfg_scale 1.0, 512 T5 tokens.
GenerationRequest flux_defaults(int64_t vae_scale_factor);

}  // namespace tprun::pipelines
