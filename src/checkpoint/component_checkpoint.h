#pragma once
// One component folder of the diffusers layout (transformer/, vae/,
// text_encoder/, ...): config.json plus either one safetensors file or shards
// with a "*.safetensors.index.json" weight_map. Also a bare .safetensors
// file. Opening validates every header and the index against the shards.

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_header.h"

namespace tprun::checkpoint {

struct TensorLocation {
  size_t file = 0;            // index into ComponentCheckpoint::files()
  const TensorEntry* entry = nullptr;
};

class ComponentCheckpoint {
 public:
  // `path`: a component folder or one .safetensors file. `variant`: "fp16"
  // selects diffusion_pytorch_model.fp16.safetensors and the like; "" the
  // plain files. Throws CheckpointError naming the file and what is wrong.
  static ComponentCheckpoint open(const std::string& path, const std::string& variant = "");
  // Movable, not copyable: locations point into the file headers.
  ComponentCheckpoint(ComponentCheckpoint&&) = default;
  ComponentCheckpoint& operator=(ComponentCheckpoint&&) = default;
  ComponentCheckpoint(const ComponentCheckpoint&) = delete;
  ComponentCheckpoint& operator=(const ComponentCheckpoint&) = delete;

  const std::string& path() const { return path_; }
  // config.json (an empty object for a bare .safetensors file).
  const nlohmann::json& config() const { return config_; }
  bool has_config() const { return has_config_; }
  // The weight files in name order, each with its validated header.
  const std::vector<SafetensorsHeader>& files() const { return files_; }
  // "" when unsharded, else the index file's path.
  const std::string& index_path() const { return index_path_; }

  std::vector<std::string> tensor_names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // Throws CheckpointError naming the tensor and the component when absent.
  TensorLocation locate(const std::string& name) const;
  uint64_t total_bytes() const;

 private:
  ComponentCheckpoint() = default;
  std::string path_;
  nlohmann::json config_ = nlohmann::json::object();
  bool has_config_ = false;
  std::string index_path_;
  std::vector<SafetensorsHeader> files_;
  std::map<std::string, TensorLocation> where_;
};

// Refuses pickle checkpoints with a message that says how to convert.
void refuse_pickle(const std::string& path);

// True for *.bin, *.pt, *.pth, *.ckpt, *.pkl.
bool is_pickle_file(const std::string& path);

}  // namespace tprun::checkpoint
