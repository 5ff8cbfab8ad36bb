#pragma once
// The generic load of a pipeline's model components from its spec: every TP
// plan checked for this tp first (the transformer's always, so the encode
// phase of a staged job fails as the full load would; a split text
// encoder's), then each component the load holds, in load order (transformer,
// text encoders, VAE), through the model registry, on the ranks that hold it.
// The family takes its components by name and class.

#include <map>
#include <memory>
#include <string>

#include "models/model.h"
#include "parallel/tp_context.h"
#include "pipelines/pipeline.h"

namespace tprun::checkpoint {
struct PipelineFolder;
}

namespace tprun::pipelines {

class ComponentConfigs;
struct ComponentSpec;
struct PipelineSpec;

class LoadedComponents {
 public:
  // The component `name` as M, or null when this load did not hold it.
  // Internal error when it is not an M (a spec naming a class its family cannot run).
  template <class M>
  std::unique_ptr<M> take(const std::string& name) {
    auto it = models_.find(name);
    if (it == models_.end() || !it->second) return nullptr;
    auto* typed = dynamic_cast<M*>(it->second.get());
    if (!typed) wrong_class(name);
    it->second.release();
    models_.erase(it);
    return std::unique_ptr<M>(typed);
  }
  uint64_t bytes = 0;  // weight bytes loaded on this rank

 private:
  friend LoadedComponents load_components(const checkpoint::PipelineFolder&, const PipelineSpec&,
                                          const ComponentConfigs&, const parallel::TpContext&, const PipelineOptions&);
  [[noreturn]] void wrong_class(const std::string& name) const;
  std::map<std::string, std::unique_ptr<models::Model>> models_;
};

// Whether TP rank `tp_rank` holds the model component `c` in a load with
// `options`: the text encoders with options.text_encoders, the transformer
// with options.denoiser (a staged expert not with stage_experts: its
// pipeline loads it when its stage comes), the VAE with it on rank 0 (every
// rank with decode_on_every_rank or the VAE's every_rank).
bool component_held(const ComponentSpec& c, const PipelineOptions& options, int tp_rank);

// Loads what `options` asks for (text encoders; the transformer and the VAE
// with options.denoiser). Errors name the component's files.
LoadedComponents load_components(const checkpoint::PipelineFolder& pf, const PipelineSpec& spec,
                                 const ComponentConfigs& configs, const parallel::TpContext& tp,
                                 const PipelineOptions& options);

}  // namespace tprun::pipelines
