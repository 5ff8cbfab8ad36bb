#include "presets/preset_writer.h"

#include <unistd.h>

#include <fmt/format.h>

#include "checkpoint/safetensors_writer.h"
#include "models/init_weights.h"
#include "models/model_registry.h"
#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

void throw_folder_error(const std::string& dir, const std::string& what) {
  throw ConfigError(fmt::format("{}: cannot write the pipeline folder: {}", dir, what));
}

fs::path begin_output_folder(const std::string& trimmed, bool force) {
  if (trimmed.empty()) throw ConfigError("init-model: the output folder is empty");
  const fs::path dir(trimmed);
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (ec && status.type() != fs::file_type::not_found)
    throw ConfigError(fmt::format("{}: cannot be inspected: {}", trimmed, ec.message()));
  if (fs::exists(status)) {
    if (!fs::is_directory(status))
      throw ConfigError(fmt::format("{}: exists and is not a folder; choose another output folder", trimmed));
    const bool empty = fs::is_empty(dir, ec);
    if (ec) throw ConfigError(fmt::format("{}: cannot be listed: {}", trimmed, ec.message()));
    if (!empty && !force)
      throw ConfigError(fmt::format("{}: exists and is not empty; pass --force to replace it", trimmed));
  }
  // Its parents are created where missing; one that exists must be a folder.
  for (fs::path p = dir.parent_path(); !p.empty(); p = p.parent_path()) {
    const fs::file_status ps = fs::status(p, ec);
    if (ps.type() == fs::file_type::not_found) {
      if (p == p.root_path()) break;
      continue;
    }
    if (ec) throw ConfigError(fmt::format("{}: its folder {} cannot be inspected: {}", trimmed, p.string(), ec.message()));
    if (!fs::is_directory(ps)) {
      throw ConfigError(fmt::format("{}: {} is not a folder; choose an output folder whose parents are folders",
                                    trimmed, p.string()));
    }
    break;
  }
  const fs::path tmp = trimmed + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  ec.clear();
  fs::create_directories(tmp, ec);
  if (ec) {
    throw IoError(fmt::format("{}: cannot create the folder {} to write it in: {}; choose an output folder where "
                              "you may create folders",
                              trimmed, tmp.string(), ec.message()));
  }
  return tmp;
}

void commit_output_folder(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir)) {
    fs::rename(tmp, dir);
    return;
  }
  if (fs::is_empty(dir)) {
    fs::remove(dir);
    fs::rename(tmp, dir);
    return;
  }
  const fs::path old = dir.string() + ".old-" + std::to_string(::getpid());
  fs::rename(dir, old);
  try {
    fs::rename(tmp, dir);
  } catch (...) {
    fs::rename(old, dir, ec);
    throw;
  }
  fs::remove_all(old, ec);
}

void write_json(const fs::path& path, const json& j) {
  checkpoint::write_file_atomically(path.string(), j.dump(2) + "\n", /*overwrite=*/false);
}

void write_component(const fs::path& root, const std::string& component, const json& config,
                     const std::string& weights_file, uint64_t seed, InitModelSummary& summary) {
  const fs::path dir = root / component, config_path = dir / "config.json";
  fs::create_directories(dir);
  write_json(config_path, config);
  const auto table = models::model_table_for(config, config_path.string());
  if (!table) {
    const std::string cls = config.contains("_class_name") ? config["_class_name"].dump()
                                                           : config.value("architectures", json::array()).dump();
    throw ConfigError(fmt::format("{}: tprun has no tensor table for {}", config_path.string(), cls));
  }
  summary.bytes +=
      models::write_random_weights(*table, models::component_seed(seed, component), (dir / weights_file).string());
  for (const auto& t : table->tensors) summary.tensors += t.saved ? 1 : 0;
}

json flow_match_scheduler_config(const json& overrides) {
  json config = {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                 {"_diffusers_version", kDiffusersVersion},
                 {"base_image_seq_len", 256},
                 {"base_shift", 0.5},
                 {"invert_sigmas", false},
                 {"max_image_seq_len", 4096},
                 {"max_shift", 1.15},
                 {"num_train_timesteps", 1000},
                 {"shift", 3.0},
                 {"shift_terminal", nullptr},
                 {"stochastic_sampling", false},
                 {"time_shift_type", "exponential"},
                 {"use_beta_sigmas", false},
                 {"use_dynamic_shifting", true},
                 {"use_exponential_sigmas", false},
                 {"use_karras_sigmas", false}};
  config.update(overrides);
  return config;
}

}  // namespace tprun::presets
