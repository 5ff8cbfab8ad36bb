// FluxPipeline's call defaults. See flux_defaults.h.
#include "pipelines/flux_defaults.h"

namespace tprun::pipelines {

GenerationRequest flux_defaults(int64_t vae_scale_factor) {
  GenerationRequest d;
  d.height = d.width = 128 * vae_scale_factor;  // default_sample_size * vae_scale_factor
  d.steps = 28;
  d.guidance = 3.5;
  d.true_cfg_scale = 1.0;
  d.max_sequence_length = 512;
  return d;
}

}  // namespace tprun::pipelines
