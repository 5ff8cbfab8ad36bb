#include "pipelines/generation_request.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::pipelines {

bool GenerationRequest::has_given(const std::string& name) const { return given && given->count(name) != 0; }

std::vector<std::pair<std::string, std::string>> generation_text(const GenerationRequest& r, const std::string& model,
                                                                  const std::string& dtype) {
  std::vector<std::pair<std::string, std::string>> t = {{"Software", fmt::format("tprun {}", TPRUN_VERSION)},
                                                        {"prompt", r.prompt}};
  if (r.negative_prompt) t.emplace_back("negative_prompt", *r.negative_prompt);
  t.emplace_back("seed", std::to_string(r.seed));
  auto add = [&](const char* key, const auto& value) {
    if (value) t.emplace_back(key, fmt::format("{}", *value));
  };
  add("height", r.height);
  add("width", r.width);
  add("steps", r.steps);
  add("guidance", r.guidance);
  add("true_cfg_scale", r.true_cfg_scale);
  add("guidance_2", r.guidance_2);
  add("max_sequence_length", r.max_sequence_length);
  if (r.frame_count() > 1) {
    t.emplace_back("frames", std::to_string(r.frame_count()));
    add("fps", r.fps);
  }
  // One "lora" chunk per adapter, in order: "<scale> <path>" (only with adapters: a base image's text is unchanged).
  for (const auto& l : r.lora_set()) t.emplace_back("lora", fmt::format("{} {}", l.scale, l.path));
  t.emplace_back("model", model);
  t.emplace_back("dtype", dtype);
  return t;
}

}  // namespace tprun::pipelines
