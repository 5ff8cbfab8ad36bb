// The registry of pipeline specs and the component specs by role (see pipeline_spec.h).
#include "pipelines/pipeline_spec.h"

#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/pipeline_folder.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

std::map<std::string, std::unique_ptr<PipelineSpec>>& specs() {
  static std::map<std::string, std::unique_ptr<PipelineSpec>> r;
  return r;
}

ComponentSpec component(const std::string& name, ComponentRole role, const std::string& library,
                        const std::vector<std::string>& classes) {
  ComponentSpec c;
  c.name = name;
  c.role = role;
  c.library = library;
  c.classes = classes;
  return c;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Encode: return "encode";
    case Phase::Denoise: return "denoise";
    case Phase::Decode: return "decode";
  }
  return "?";
}

bool ComponentSpec::has_model() const {
  return role == ComponentRole::kTransformer || role == ComponentRole::kTextEncoder || role == ComponentRole::kVae;
}

Phase ComponentSpec::phase() const {
  switch (role) {
    case ComponentRole::kTextEncoder: return Phase::Encode;
    case ComponentRole::kVae: return Phase::Decode;
    default: return Phase::Denoise;
  }
}

GenerationRequest CallDefaults::request(int64_t vae_scale_factor) const {
  GenerationRequest d;
  d.height = d.width = sample_size * vae_scale_factor;  // default_sample_size * vae_scale_factor
  d.steps = steps;
  d.guidance = guidance;
  d.true_cfg_scale = true_cfg_scale;
  d.max_sequence_length = max_sequence_length;
  if (height > 0) d.height = height;
  if (width > 0) d.width = width;
  if (frames > 0) d.frames = frames;
  return d;
}

const ComponentSpec* PipelineSpec::find(const std::string& name) const {
  for (const auto& c : components)
    if (c.name == name) return &c;
  return nullptr;
}

std::vector<const ComponentSpec*> PipelineSpec::models_in_load_order() const {
  std::vector<const ComponentSpec*> out;
  for (ComponentRole role : {ComponentRole::kTransformer, ComponentRole::kTextEncoder, ComponentRole::kVae}) {
    for (const auto& c : components)
      if (c.role == role) out.push_back(&c);
  }
  return out;
}

ComponentSpec transformer_component(const std::string& cls) {
  return component("transformer", ComponentRole::kTransformer, "diffusers", {cls});
}

ComponentSpec vae_component(const std::vector<std::string>& classes) {
  return component("vae", ComponentRole::kVae, "diffusers", classes);
}

ComponentSpec scheduler_component(const std::vector<std::string>& classes) {
  return component("scheduler", ComponentRole::kScheduler, "diffusers", classes);
}

ComponentSpec text_encoder_component(const std::string& name, const std::vector<std::string>& classes,
                                     TextSplit split,
                                     std::function<std::vector<int64_t>(const ComponentConfigs&)> hidden_layers) {
  ComponentSpec c = component(name, ComponentRole::kTextEncoder, "transformers", classes);
  c.splittable = split != TextSplit::kNever;
  c.split_by_default = split == TextSplit::kByDefault;
  c.hidden_layers = std::move(hidden_layers);
  return c;
}

ComponentSpec tokenizer_component(const std::string& name, const std::vector<std::string>& classes) {
  return component(name, ComponentRole::kTokenizer, "transformers", classes);
}

ComponentSpec unused_component(const std::string& name, const std::string& library,
                               const std::vector<std::string>& classes) {
  ComponentSpec c = component(name, ComponentRole::kUnused, library, classes);
  c.required = false;
  return c;
}

checkpoint::PipelineFolder open_registered_folder(const std::string& folder) {
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  checkpoint::PipelineFolder pf = checkpoint::open_pipeline_folder(folder);
  if (!find_pipeline_spec(pf.cls)) {
    throw ConfigError(fmt::format("{}/model_index.json: _class_name '{}' is not a pipeline tprun can run (known: {})",
                                  folder, pf.cls, fmt::join(pipeline_spec_names(), ", ")),
                      true);
  }
  return pf;
}

const PipelineSpec* find_pipeline_spec(const std::string& cls) {
  auto it = specs().find(cls);
  return it == specs().end() ? nullptr : it->second.get();
}

std::vector<std::string> pipeline_spec_names() {
  std::vector<std::string> names;
  for (const auto& [name, spec] : specs()) names.push_back(name);
  return names;
}

namespace detail {
bool register_pipeline_spec(const PipelineSpecFn& fn) {
  auto spec = std::make_unique<PipelineSpec>(fn());
  const std::string cls = spec->cls;
  specs()[cls] = std::move(spec);
  return true;
}
}  // namespace detail

}  // namespace tprun::pipelines
