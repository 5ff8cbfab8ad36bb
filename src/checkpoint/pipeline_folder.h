#pragma once
// A diffusers pipeline folder: model_index.json naming the components, each a
// sub-folder (transformer/, vae/, text_encoder/, tokenizer/, scheduler/, ...).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tprun::checkpoint {

struct PipelineComponent {
  std::string name;     // "transformer"
  std::string library;  // "diffusers", "transformers"
  std::string cls;      // "FluxTransformer2DModel"
  std::string path;     // <folder>/<name>
};

struct PipelineFolder {
  std::string path;
  std::string cls;  // "_class_name", e.g. "FluxPipeline"
  nlohmann::json index;
  std::vector<PipelineComponent> components;  // non-null entries, in name order

  const PipelineComponent* find(const std::string& name) const;
};

// Whether `path` holds a model_index.json: false only when there is none
// (ENOENT / ENOTDIR, EINTR retried); CheckpointError when it is not a regular
// file and IoError naming the errno for any other failure to stat it, so an
// existing file is never reported as missing.
bool is_pipeline_folder(const std::string& path);

// Reads and checks model_index.json: _class_name a non-empty string, every
// non-null component ["library", "Class"] with its folder. CheckpointError
// (every rank) naming model_index.json and the field otherwise.
PipelineFolder open_pipeline_folder(const std::string& path);

}  // namespace tprun::checkpoint
