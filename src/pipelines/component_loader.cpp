// The generic load of a pipeline's model components (see component_loader.h).
#include "pipelines/component_loader.h"

#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "models/model_registry.h"
#include "models/model_table.h"
#include "pipelines/component_configs.h"
#include "pipelines/pipeline_spec.h"
#include "runtime/error.h"

namespace tprun::pipelines {

void LoadedComponents::wrong_class(const std::string& name) const {
  throw Error(Error::Kind::Internal,
              fmt::format("the pipeline's component '{}' loaded as a class its family does not run", name));
}

bool component_held(const ComponentSpec& c, const PipelineOptions& options, int tp_rank) {
  switch (c.role) {
    case ComponentRole::kTransformer: return options.denoiser && !(c.staged_expert && options.stage_experts);
    case ComponentRole::kTextEncoder: return options.text_encoders;
    case ComponentRole::kVae: return options.denoiser && (options.decode_on_every_rank || c.every_rank || tp_rank == 0);
    default: return false;
  }
}

LoadedComponents load_components(const checkpoint::PipelineFolder& pf, const PipelineSpec& spec,
                                 const ComponentConfigs& configs, const parallel::TpContext& tp,
                                 const PipelineOptions& options) {
  const std::vector<const ComponentSpec*> order = spec.models_in_load_order();
  // Every TP plan for this tp before any weight byte is read: the text
  // encoders' first (what an encode phase alone would refuse), then the
  // transformer's.
  std::vector<const ComponentSpec*> plans;
  for (const ComponentSpec* c : order)
    if (c->role == ComponentRole::kTextEncoder) plans.push_back(c);
  for (const ComponentSpec* c : order)
    if (c->role != ComponentRole::kTextEncoder) plans.push_back(c);
  for (const ComponentSpec* c : plans) {
    if (!component_split(*c, options) || !configs.has(c->name)) continue;
    if (c->role == ComponentRole::kTextEncoder && !options.text_encoders) continue;
    const ComponentConfig& cc = configs.at(c->name);
    const auto table = models::model_table_for(cc.json, cc.path, component_load_options(*c, configs, options));
    if (table) models::validate_tp_size(*table, tp.size, cc.path);
  }
  LoadedComponents out;
  for (const ComponentSpec* c : order) {
    if (!component_held(*c, options, tp.rank) || !configs.has(c->name)) continue;
    const ComponentConfig& cc = configs.at(c->name);
    auto source = checkpoint::open_weight_source(cc.folder, options.variant);
    const parallel::TpContext group = component_split(*c, options) ? tp : parallel::TpContext{};
    auto model = models::load_model(*source, cc.json, cc.path, group, component_load_options(*c, configs, options));
    out.bytes += model->bytes_loaded();
    out.models_[c->name] = std::move(model);
  }
  return out;
}

}  // namespace tprun::pipelines
