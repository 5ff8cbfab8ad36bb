#pragma once
// The configs of a pipeline folder's components, read once per load (or
// layout) before any weight byte, and what the spec derives from them:
//   read_component_configs  each model component's config.json the load
//                           needs (the text encoders' only when they are
//                           loaded), the VAE's facts (models/vae.h), then
//                           the family's cross-checks
//   component_load_options  the ModelOptions a component is loaded with
//   component_split         whether a component is split over the TP group
//   need_component          a model_index.json entry, or an error naming it

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "models/vae.h"
#include "pipelines/pipeline.h"
#include "pipelines/pipeline_spec.h"

namespace tprun::checkpoint {
struct PipelineComponent;
struct PipelineFolder;
}  // namespace tprun::checkpoint

namespace tprun::pipelines {


// The component `name` of `folder`; CheckpointError "model_index.json names
// no 'x' component (a <class> needs it)" when it has none.
const checkpoint::PipelineComponent& need_component(const checkpoint::PipelineFolder& folder,
                                                    const std::string& name);

struct ComponentConfig {
  std::string folder;  // the component's folder
  std::string path;    // its config.json (for messages)
  nlohmann::json json;
};

class ComponentConfigs {
 public:
  const checkpoint::PipelineFolder& folder() const { return *folder_; }
  const std::string& cls() const;  // the pipeline class
  bool has(const std::string& component) const { return read_.count(component) > 0; }
  // CheckpointError naming the component when it was not read (internal: a spec reads what it checks).
  const ComponentConfig& at(const std::string& component) const;
  // The component's typed config (Config::from_json: CheckpointError naming the file and field).
  template <class Config>
  Config parse(const std::string& component) const {
    const ComponentConfig& c = at(component);
    return Config::from_json(c.json, c.path);
  }
  // The VAE's facts from its config (models/vae.h).
  const models::VaeInfo& vae() const { return vae_; }
  // Whether the load reads the text encoders (PipelineOptions::text_encoders).
  bool text_encoders() const { return text_encoders_; }
  // The family's shapes (PipelineSpec::shapes), read once with the configs.
  const FamilyShapes& shapes() const { return shapes_; }

 private:
  friend ComponentConfigs read_component_configs(const checkpoint::PipelineFolder&, const PipelineSpec&,
                                                 const PipelineOptions&);
  const checkpoint::PipelineFolder* folder_ = nullptr;
  std::map<std::string, ComponentConfig> read_;
  models::VaeInfo vae_;
  bool text_encoders_ = true;
  FamilyShapes shapes_;
};

// The transformer's and the VAE's configs, the text encoders' where
// options.text_encoders, [memory] vae_tiling's tiles against the VAE, the
// packed channels (spec.packs_2x2), then spec.cross_check. `pf` must outlive the result. CheckpointError naming the
// file and the field.
ComponentConfigs read_component_configs(const checkpoint::PipelineFolder& pf, const PipelineSpec& spec,
                                        const PipelineOptions& options);

// CheckpointError (naming both files) unless the transformer's in_channels
// is 4 x the VAE's latent channels: 2x2 patches packed into the channels.
void check_packed_channels(int64_t in_channels, const std::string& transformer_config, int64_t latent_channels,
                           const std::string& vae_config);

// Split over the TP group: the transformer always; a splittable text encoder
// as options.shard_text_encoders says (the spec's default when unset); never
// the VAE.
bool component_split(const ComponentSpec& component, const PipelineOptions& options);

// The ModelOptions `component` is loaded with: component_options(options,
// name) plus its role's (the transformer's shard_modulation, a text encoder's
// hidden_layers, the VAE's decoder part). The VAE's load itself lifts a
// 16-bit dtype to fp32 under force_upcast (models::vae_compute_dtype).
models::ModelOptions component_load_options(const ComponentSpec& component, const ComponentConfigs& configs,
                                            const PipelineOptions& options);

}  // namespace tprun::pipelines
