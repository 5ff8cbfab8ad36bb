#include "pipelines/pipeline.h"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/pipeline_folder.h"
#include "memory/offload_plan.h"
#include "pipelines/device_map.h"
#include "pipelines/component_check.h"
#include "runtime/error.h"

namespace tprun::pipelines {

models::ModelOptions component_options(const PipelineOptions& options) {
  models::ModelOptions o = options.component_base;
  o.dtype = options.dtype;
  o.device = options.device;
  return o;
}

models::ModelOptions component_options(const PipelineOptions& options, const std::string& component) {
  models::ModelOptions o = component_options(options);
  o.component = component;
  // This component's device-map entries, relative to it.
  std::vector<memory::DevicePlacement> mine;
  for (const auto& [name, dev] : o.memory.device_map) {
    if (name == component) {
      mine.emplace_back("", dev);
    } else if (memory::module_encloses(component, name)) {
      mine.emplace_back(name.substr(component.size() + 1), dev);
    }
  }
  o.memory.device_map = std::move(mine);
  return o;
}
namespace {

std::map<std::string, PipelineLoader>& registry() {
  static std::map<std::string, PipelineLoader> r;
  return r;
}

std::map<std::string, PromptTokenizer>& tokenizers() {
  static std::map<std::string, PromptTokenizer> r;
  return r;
}

}  // namespace

namespace detail {
bool register_pipeline(const char* cls, PipelineLoader loader) {
  registry()[cls] = std::move(loader);
  return true;
}
bool register_prompt_tokenizer(const char* cls, PromptTokenizer tokenizer) {
  tokenizers()[cls] = std::move(tokenizer);
  return true;
}
}  // namespace detail

std::vector<PromptTokens> tokenize_prompt(const std::string& folder, const std::string& prompt,
                                          int64_t max_sequence_length) {
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  auto it = tokenizers().find(pf.cls);
  if (it == tokenizers().end()) {
    std::vector<std::string> known;
    for (const auto& [name, fn] : tokenizers()) known.push_back(name);
    throw ConfigError(fmt::format("{}/model_index.json: _class_name '{}' is not a pipeline tprun can tokenize for "
                                  "(known: {})",
                                  folder, pf.cls, fmt::join(known, ", ")),
                      true);
  }
  check_pipeline_components(pf);
  return it->second(folder, prompt, max_sequence_length);
}

double StageTimes::denoise_s() const {
  double s = 0;
  for (double x : step_s) s += x;
  return s;
}

GenerationResult Pipeline::generate(const GenerationRequest& request, const StepCallback& on_step) const {
  auto results = generate_batch({request}, on_step);
  if (!results[0].error.empty()) throw RequestError(results[0].error, true);
  return std::move(results[0]);
}

std::vector<std::string> pipeline_names() {
  std::vector<std::string> names;
  for (const auto& [name, loader] : registry()) names.push_back(name);
  return names;
}

std::unique_ptr<Pipeline> load_pipeline(const std::string& folder, const parallel::TpContext& tp,
                                        const PipelineOptions& options) {
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  auto it = registry().find(pf.cls);
  if (it == registry().end()) {
    throw ConfigError(fmt::format("{}/model_index.json: _class_name '{}' is not a pipeline tprun can run (known: {})",
                                  folder, pf.cls, fmt::join(pipeline_names(), ", ")),
                      true);
  }
  check_pipeline_components(pf);  // before the device map reads any component config
  return it->second(folder, tp, resolve_device_map(pf, tp, options));
}

}  // namespace tprun::pipelines
