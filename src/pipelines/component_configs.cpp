// Reading a pipeline folder's component configs against its spec (see component_configs.h).
#include "pipelines/component_configs.h"

#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "models/model_config.h"
#include "pipelines/component_check.h"
#include "pipelines/pipeline_spec.h"
#include "runtime/error.h"

namespace tprun::pipelines {

const checkpoint::PipelineComponent& need_component(const checkpoint::PipelineFolder& f, const std::string& name) {
  const auto* c = f.find(name);
  if (!c) {
    throw CheckpointError(fmt::format("{}: model_index.json names no '{}' component (a {} needs it)", f.path, name,
                                      f.cls),
                          true);
  }
  return *c;
}

const std::string& ComponentConfigs::cls() const { return folder_->cls; }

const ComponentConfig& ComponentConfigs::at(const std::string& component) const {
  auto it = read_.find(component);
  if (it == read_.end()) {
    throw Error(Error::Kind::Internal,
                fmt::format("{}: the {} config of component '{}' was not read for this load", folder_->path,
                            folder_->cls, component));
  }
  return it->second;
}

ComponentConfigs read_component_configs(const checkpoint::PipelineFolder& pf, const PipelineSpec& spec,
                                        const PipelineOptions& options) {
  ComponentConfigs c;
  c.folder_ = &pf;
  c.text_encoders_ = options.text_encoders;
  // The transformer and the VAE are read whether or not they are loaded (the
  // encode phase of a staged job still sizes its requests from them).
  for (ComponentRole role : {ComponentRole::kTransformer, ComponentRole::kVae, ComponentRole::kTextEncoder}) {
    if (role == ComponentRole::kTextEncoder && !options.text_encoders) continue;
    for (const auto& s : spec.components) {
      if (s.role != role) continue;
      if (!s.required && !pf.find(s.name)) continue;  // an optional component the folder does not have
      ComponentConfig cc;
      cc.folder = need_component(pf, s.name).path;
      cc.json = models::read_component_config(cc.folder, &cc.path);
      if (role == ComponentRole::kVae) {
        c.vae_ = models::read_vae_info(cc.json, cc.path);
        // [memory] tiles in whole latents, on every rank before any weight (only the ranks that decode load
        // the VAE, so a refusal of its own load would leave the others waiting).
        check_vae_tiles(options.component_base.memory, c.vae_.spatial_scale, c.vae_.default_tile_sample, cc.path);
      }
      c.read_[s.name] = std::move(cc);
    }
  }
  c.shapes_ = spec.shapes(c);
  if (spec.packs_2x2) {
    check_packed_channels(c.shapes_.transformer.in_channels, c.at("transformer").path, c.vae_.latent_channels,
                          c.at("vae").path);
  }
  if (spec.cross_check) spec.cross_check(c);
  return c;
}

void check_packed_channels(int64_t in_channels, const std::string& transformer_config, int64_t latent_channels,
                           const std::string& vae_config) {
  if (in_channels != 4 * latent_channels) {
    throw CheckpointError(fmt::format("{}: in_channels {} is not 4 x the VAE's latent_channels {} ({})",
                                      transformer_config, in_channels, latent_channels, vae_config),
                          true);
  }
}

bool component_split(const ComponentSpec& component, const PipelineOptions& options) {
  switch (component.role) {
    case ComponentRole::kTransformer: return true;
    case ComponentRole::kTextEncoder:
      return component.splittable && options.shard_text_encoders.value_or(component.split_by_default);
    default: return false;
  }
}

models::ModelOptions component_load_options(const ComponentSpec& component, const ComponentConfigs& configs,
                                            const PipelineOptions& options) {
  models::ModelOptions o = component_options(options, component.name);
  switch (component.role) {
    case ComponentRole::kTransformer: o.shard_modulation = options.shard_modulation; break;
    case ComponentRole::kTextEncoder:
      if (component.hidden_layers) o.hidden_layers = component.hidden_layers(configs);
      break;
    case ComponentRole::kVae: o.part = "decoder"; break;
    default: break;
  }
  return o;
}

}  // namespace tprun::pipelines
