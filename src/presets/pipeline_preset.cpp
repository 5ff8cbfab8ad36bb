#include "presets/pipeline_preset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_diffusers(const json& config) { return config.contains("_class_name"); }

// model_index.json's ["library", "class"] of a component.
json index_entry(const PresetComponent& c) {
  if (is_diffusers(c.config)) return json::array({"diffusers", c.config.at("_class_name")});
  if (c.config.contains("architectures") && c.config["architectures"].is_array() &&
      !c.config["architectures"].empty())
    return json::array({"transformers", c.config["architectures"][0]});
  throw ConfigError(fmt::format("{}/config.json: names neither '_class_name' nor 'architectures'", c.name));
}

const char* weights_file(const json& config) {
  return is_diffusers(config) ? "diffusion_pytorch_model.safetensors" : "model.safetensors";
}

// The config of component `name` in `components` (const or not).
template <typename Components>
auto& config_of(Components& components, const std::string& pipeline_class, const std::string& name) {
  for (auto& c : components) {
    if (c.name == name) return c.config;
  }
  throw ConfigError(fmt::format("{}: the preset has no component '{}'", pipeline_class, name));
}

}  // namespace

json PipelinePreset::model_index() const {
  json j = index_extras;
  j["_class_name"] = pipeline_class;
  j["_diffusers_version"] = kDiffusersVersion;
  j["scheduler"] = json::array({"diffusers", scheduler.at("_class_name")});
  for (const auto& t : tokenizers) j[t.name] = json::array({"transformers", t.class_name});
  for (const auto& c : components) j[c.name] = index_entry(c);
  return j;
}

json& PipelinePreset::config(const std::string& name) { return config_of(components, pipeline_class, name); }

const json& PipelinePreset::config(const std::string& name) const {
  return config_of(components, pipeline_class, name);
}

json diffusers_config(const std::string& class_name, json fields) {
  fields["_class_name"] = class_name;
  fields["_diffusers_version"] = kDiffusersVersion;
  return fields;
}

void write_pipeline_preset(const fs::path& root, const PipelinePreset& preset, uint64_t seed,
                           InitModelSummary& summary) {
  for (const auto& t : preset.tokenizers) {
    if (!fs::is_directory(root / t.name))
      throw ConfigError(fmt::format("{}: the preset's tokenizer folder '{}' was not written", preset.pipeline_class,
                                    t.name));
  }
  write_json(root / "model_index.json", preset.model_index());
  fs::create_directories(root / "scheduler");
  write_json(root / "scheduler" / "scheduler_config.json", preset.scheduler);
  for (const auto& c : preset.components) write_component(root, c.name, c.config, weights_file(c.config), seed, summary);
}

void check_preset(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}

std::vector<std::string> preset_names() { return {"tiny", "small"}; }

void throw_unknown_preset(const std::string& name) {
  throw ConfigError(fmt::format("unknown preset '{}'; choose one of: {}", name, fmt::join(preset_names(), ", ")));
}

}  // namespace tprun::presets
