// A pipeline's layout from its spec and its folder's configs (see pipeline_layout.h).
#include "pipelines/pipeline_layout.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/pipeline_folder.h"
#include "models/model_registry.h"
#include "models/vae.h"
#include "pipelines/component_check.h"
#include "pipelines/component_configs.h"
#include "pipelines/component_loader.h"
#include "pipelines/latents.h"
#include "runtime/error.h"

namespace tprun::pipelines {

const ComponentLayout* PipelineLayout::find(const std::string& component) const {
  for (const auto& c : components)
    if (c.name == component) return &c;
  return nullptr;
}

int64_t PipelineLayout::image_tokens(int64_t height, int64_t width) const {
  return image_seq_len(height, width, vae_scale_factor);
}

int64_t PipelineLayout::latent_tokens(int64_t height, int64_t width, int64_t frames) const {
  const int64_t latent_frames = (std::max<int64_t>(frames, 1) - 1) / std::max<int64_t>(temporal_scale, 1) + 1;
  return image_tokens(height, width) * latent_frames;
}

PipelineLayout pipeline_layout(const std::string& folder, const PipelineOptions& options) {
  const checkpoint::PipelineFolder pf = open_registered_folder(folder);  // load_pipeline's refusals
  const PipelineSpec* spec = find_pipeline_spec(pf.cls);
  check_pipeline_components(pf);
  const ComponentConfigs configs = read_component_configs(pf, *spec, options);
  const FamilyShapes& shapes = configs.shapes();

  PipelineLayout l;
  l.cls = pf.cls;
  l.transformer = shapes.transformer;
  l.text_hidden = options.text_encoders ? shapes.text_hidden : 0;
  l.pooled_dim = shapes.pooled_dim;
  const models::VaeInfo& vae = configs.vae();
  const std::string vae_dtype = models::vae_compute_dtype(vae, options.dtype);
  l.vae = models::vae_shape(vae, vae_dtype, options.device, options.component_base.memory);
  l.vae_scale_factor = vae.spatial_scale;
  l.temporal_scale = vae.temporal_scale;
  l.defaults = spec->defaults.request(l.vae_scale_factor);
  for (const ComponentSpec* c : spec->models_in_load_order()) {
    if (!component_held(*c, options, 0)) continue;  // TP rank 0 holds whatever the load holds
    if (!configs.has(c->name)) continue;             // an optional component the folder does not have
    ComponentLayout cl;
    cl.name = c->name;
    cl.path = configs.at(c->name).folder;
    cl.phase = c->phase();
    cl.options = component_load_options(*c, configs, options);
    if (c->role == ComponentRole::kVae) cl.options.dtype = vae_dtype;  // the dtype it computes in
    if (const auto* family = models::find_model_family(need_component(pf, c->name).cls)) {
      cl.class_skip = family->class_skip;
    }
    cl.sharded = component_split(*c, options);
    cl.rank_zero_only = c->role == ComponentRole::kVae && !options.decode_on_every_rank && !c->every_rank;
    l.components.push_back(std::move(cl));
  }
  return l;
}

}  // namespace tprun::pipelines
