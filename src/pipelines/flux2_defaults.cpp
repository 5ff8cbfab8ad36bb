// FLUX.2's fixed layers and call defaults. See flux2_defaults.h.
#include "pipelines/flux2_defaults.h"

namespace tprun::pipelines {

std::vector<int64_t> flux2_stacked_layers(bool klein) {
  return klein ? std::vector<int64_t>{9, 18, 27} : std::vector<int64_t>{10, 20, 30};
}

GenerationRequest flux2_defaults(int64_t vae_scale_factor) {
  GenerationRequest d;
  d.height = d.width = 128 * vae_scale_factor;  // default_sample_size * vae_scale_factor
  d.steps = 50;
  d.guidance = 4.0;
  d.true_cfg_scale = 1.0;
  d.max_sequence_length = 512;
  return d;
}

}  // namespace tprun::pipelines
