#include "pipelines/pipeline.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/pipeline_folder.h"
#include "memory/offload_plan.h"
#include "pipelines/device_map.h"
#include "pipelines/component_check.h"
#include "pipelines/pipeline_spec.h"
#include "runtime/error.h"

namespace tprun::pipelines {

void Pipeline::prepare_loras(const std::vector<std::vector<LoraChoice>>& sets, bool, const std::string& apply) {
  lora::parse_lora_apply(apply, "lora_apply");
  for (const auto& set : sets) {
    if (!set.empty()) {
      throw ConfigError(fmt::format("{}: {} takes no LoRA adapters (adapter {})", folder(), class_name(),
                                    set.front().path),
                        true);
    }
  }
}

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
std::vector<PromptTokens> tokenize_prompt(const std::string& folder, const std::string& prompt,
                                          int64_t max_sequence_length) {
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const PipelineSpec* spec = find_pipeline_spec(pf.cls);
  if (!spec || !spec->tokenize) {
    std::vector<std::string> known;
    for (const auto& name : pipeline_spec_names())
      if (find_pipeline_spec(name)->tokenize) known.push_back(name);
    throw ConfigError(fmt::format("{}/model_index.json: _class_name '{}' is not a pipeline tprun can tokenize for "
                                  "(known: {})",
                                  folder, pf.cls, fmt::join(known, ", ")),
                      true);
  }
  check_pipeline_components(pf);
  return spec->tokenize(folder, prompt, max_sequence_length);
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

namespace {

// A pipeline without stages: the whole batch runs in finish_in_flight.
struct WholeBatch final : Pipeline::InFlight {
  std::vector<GenerationRequest> requests;
  StepCallback on_step;
};

}  // namespace

std::unique_ptr<Pipeline::InFlight> Pipeline::start_batch(const std::vector<GenerationRequest>& requests,
                                                          const StepCallback& on_step) const {
  auto b = std::make_unique<WholeBatch>();
  b->requests = requests;
  b->on_step = on_step;
  return b;
}

std::vector<GenerationResult> Pipeline::finish_in_flight(InFlight& batch) const {
  auto& b = dynamic_cast<WholeBatch&>(batch);
  return generate_batch(b.requests, b.on_step);
}

std::vector<int64_t> Pipeline::request_latent_shape(const GenerationRequest& request) const {
  if (request.frame_count() != 1) {
    throw Error(Error::Kind::Internal,
                fmt::format("{} makes images, yet was asked the latents of {} frames (check_request refuses them)",
                            class_name(), request.frame_count()));
  }
  return latent_shape(request.height.value_or(0), request.width.value_or(0));
}

int64_t Pipeline::latent_tokens(const GenerationRequest& request) const {
  return request_latent_shape(request).at(0);
}

std::vector<std::string> pipeline_names() { return pipeline_spec_names(); }

std::unique_ptr<Pipeline> load_pipeline(const std::string& folder, const parallel::TpContext& tp,
                                        const PipelineOptions& options) {
  const checkpoint::PipelineFolder pf = open_registered_folder(folder);
  const PipelineSpec* spec = find_pipeline_spec(pf.cls);
  check_pipeline_components(pf);  // before the device map reads any component config
  return spec->load(folder, tp, resolve_device_map(pf, tp, options));
}

}  // namespace tprun::pipelines
