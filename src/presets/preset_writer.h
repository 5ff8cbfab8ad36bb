#pragma once
// What the `tprun init-model` writers of every pipeline family share: the
// output folder's checks and its atomic commit, config.json + random weights
// of one component, JSON files, and the scheduler config the FLUX pipelines use.

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace tprun::presets {

constexpr const char* kDiffusersVersion = "0.40.0";

struct InitModelSummary {
  int64_t tensors = 0;  // written, all components
  int64_t bytes = 0;    // of tensor data
  int64_t clip_vocab_size = 0, t5_tokenizer_length = 0;  // FLUX.1
  int64_t text_vocab_size = 0;                            // FLUX.2
};

// Checks `dir` (absent, empty, or with `force` a folder to replace; never a
// file, nor below one) and returns the temporary folder to build in
// (`dir`.tmp-<pid>, empty). ConfigError naming the folder; IoError naming
// the temporary folder where the system refuses to create it (a read-only
// or virtual file system such as /proc, permissions).
std::filesystem::path begin_output_folder(const std::string& dir, bool force);
// Moves the finished temporary folder into place (replacing `dir` with force).
void commit_output_folder(const std::filesystem::path& tmp, const std::filesystem::path& dir);
// ConfigError "<dir>: cannot write the pipeline folder: <what>".
[[noreturn]] void throw_folder_error(const std::string& dir, const std::string& what);
// Runs `fill(tmp)` inside begin/commit; removes the temporary folder on failure.
template <typename Fill>
void write_output_folder(const std::string& dir, bool force, Fill fill);

void write_json(const std::filesystem::path& path, const nlohmann::json& j);
// <root>/<component>/config.json and random weights from the model table of
// that config (models/init_weights.h), seeded per component.
void write_component(const std::filesystem::path& root, const std::string& component, const nlohmann::json& config,
                     const std::string& weights_file, uint64_t seed, InitModelSummary& summary);
// FlowMatchEulerDiscreteScheduler's config as FLUX.1-dev and FLUX.2 ship it
// (dynamic exponential shifting), with `overrides` in place of its values
// (Qwen-Image's longer and gentler shift).
nlohmann::json flow_match_scheduler_config(const nlohmann::json& overrides = nlohmann::json::object());

template <typename Fill>
void write_output_folder(const std::string& dir_arg, bool force, Fill fill) {
  std::string trimmed = dir_arg;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::filesystem::path tmp = begin_output_folder(trimmed, force);
  std::error_code ec;
  try {
    fill(tmp);
    commit_output_folder(tmp, trimmed);
  } catch (const std::filesystem::filesystem_error& e) {
    std::filesystem::remove_all(tmp, ec);
    throw_folder_error(trimmed, e.what());
  } catch (...) {
    std::filesystem::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace tprun::presets
