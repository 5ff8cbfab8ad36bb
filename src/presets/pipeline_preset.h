#pragma once
// A family's `tprun init-model` folder as data: the pipeline class, the
// scheduler's config, the tokenizer folders and the config.json of every
// model component. model_index.json, scheduler/ and each component's folder
// (config.json + random weights from the model table of that config,
// models/init_weights.h) are written from it alone, the same way for every
// family; a family's presets file holds only its sizes, its configs and the
// writing of its tokenizers (which come first: their sizes feed the configs).
//
// model_index.json follows from the data as diffusers' save_pretrained writes
// it: "_class_name", "_diffusers_version", ["diffusers", <class>] for the
// scheduler and for a component whose config names its "_class_name",
// ["transformers", <architectures[0]>] for one whose config names its
// "architectures" (then its weights are model.safetensors, not
// diffusion_pytorch_model.safetensors), ["transformers", <class>] for a
// tokenizer, and the family's other entries as given.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "presets/preset_writer.h"

namespace tprun::presets {

// A model component: <name>/config.json and its random weights.
struct PresetComponent {
  std::string name;       // the folder and the model_index.json key: "transformer"
  nlohmann::json config;  // diffusers' (with "_class_name") or transformers' (with "architectures")
};

// A tokenizer folder the family writes itself.
struct PresetTokenizer {
  std::string name;        // the folder and the model_index.json key: "tokenizer_2"
  std::string class_name;  // its transformers class: "T5TokenizerFast"
};

struct PipelinePreset {
  std::string pipeline_class;               // model_index.json's "_class_name": "FluxPipeline"
  nlohmann::json scheduler;                 // scheduler/scheduler_config.json
  std::vector<PresetTokenizer> tokenizers;  // in model_index.json
  std::vector<PresetComponent> components;  // in writing order
  nlohmann::json index_extras = nlohmann::json::object();  // model_index.json's other entries

  nlohmann::json model_index() const;
  // The config of component `name`; ConfigError naming it where there is none.
  nlohmann::json& config(const std::string& name);
  const nlohmann::json& config(const std::string& name) const;
};

// A diffusers config.json: `fields` with "_class_name" and "_diffusers_version".
nlohmann::json diffusers_config(const std::string& class_name, nlohmann::json fields);

// Writes model_index.json, scheduler/scheduler_config.json and every
// component of `preset` into `root` (the tokenizer folders are the family's).
void write_pipeline_preset(const std::filesystem::path& root, const PipelinePreset& preset, uint64_t seed,
                           InitModelSummary& summary);

// The whole folder `dir`, atomically (write_output_folder): `fill(tmp, summary)`
// writes the family's tokenizer folders into tmp, notes their sizes in
// summary and returns the PipelinePreset that is written next to them.
template <typename Fill>
InitModelSummary write_pipeline_folder(const std::string& dir, bool force, uint64_t seed, Fill fill) {
  InitModelSummary summary;
  write_output_folder(dir, force, [&](const std::filesystem::path& tmp) {
    const PipelinePreset preset = fill(tmp, summary);
    write_pipeline_preset(tmp, preset, seed, summary);
  });
  return summary;
}

// ConfigError(message) unless `ok`.
void check_preset(bool ok, const std::string& message);

// The presets every family has: "tiny" (a 64x64 image in well under a second
// on one core: the sizes' defaults) and "small" (the benchmarks' size).
std::vector<std::string> preset_names();
// ConfigError "unknown preset '<name>'; choose one of: tiny, small".
[[noreturn]] void throw_unknown_preset(const std::string& name);
// The preset `name` from `tiny` (the family's defaults): itself for "tiny",
// with `to_small(preset)` applied for "small"; ConfigError "unknown preset
// '<name>'; choose one of: tiny, small" otherwise. Preset has a `name`.
template <typename Preset, typename ToSmall>
Preset sized_preset(const std::string& name, Preset tiny, ToSmall to_small) {
  if (name != "tiny" && name != "small") throw_unknown_preset(name);
  tiny.name = name;
  if (name == "small") to_small(tiny);
  return tiny;
}

}  // namespace tprun::presets
