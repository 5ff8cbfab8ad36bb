#include "pipelines/request_checks.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <c10/core/ScalarType.h>

#include "checkpoint/pipeline_folder.h"
#include "pipelines/scheduler.h"
#include "pipelines/component_check.h"
#include "pipelines/pipeline_spec.h"
#include "text/tokenizer_common.h"
#include "runtime/error.h"

namespace tprun::pipelines {

bool RequestOptions::uses(const std::string& option) const {
  for (const auto& [name, why] : unused) {
    if (name == option) return false;
  }
  return true;
}

GenerationRequest RequestOptions::drop_unused(GenerationRequest d) const {
  if (!uses("guidance")) d.guidance.reset();
  if (!uses("true_cfg_scale")) d.true_cfg_scale.reset();
  if (!uses("negative_prompt")) d.negative_prompt.reset();
  return d;
}

GenerationRequest RequestOptions::request_defaults(GenerationRequest d) const {
  d = drop_unused(std::move(d));
  if (makes_videos() && !d.fps) d.fps = default_fps;
  return d;
}

RequestOptions request_options(const std::string& folder) {
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  if (find_pipeline_spec(pf.cls)) check_pipeline_components(pf);  // the load's order of checks
  return request_options(pf);
}

RequestOptions request_options(const checkpoint::PipelineFolder& pf) {
  const PipelineSpec* spec = find_pipeline_spec(pf.cls);
  if (!spec || !spec->request_options) {
    const std::vector<std::string> known = pipeline_spec_names();
    throw ConfigError(fmt::format("{}/model_index.json: _class_name '{}' is not a pipeline tprun can run (known: {})",
                                  pf.path, pf.cls, fmt::join(known, ", ")),
                      true);
  }
  RequestOptions o = spec->request_options(pf);
  o.cls = pf.cls;
  return o;
}

void add_scheduler_request_options(const checkpoint::PipelineFolder& pf, RequestOptions& o) {
  const auto* scheduler = pf.find("scheduler");
  if (!scheduler) return;  // the load names the missing component
  const std::string path = scheduler->path + "/scheduler_config.json";
  const StepLimit limit = make_scheduler(path, scheduler->cls)->step_limit();
  if (limit.min_steps > 1) {
    o.min_steps = limit.min_steps;
    o.min_steps_reason = fmt::format("{}: {}", path, limit.reason);
  }
}

namespace {

// frames (set, within the shared bound) against what the pipeline makes.
void check_request_frames(const GenerationRequest& r, const RequestOptions& o, const RequestFail& fail) {
  if (!r.frames) return;
  const int64_t f = *r.frames;
  if (o.max_frames <= 1) {
    if (f != 1) {
      fail("frames", fmt::format("{} makes images (one frame each), not frame sequences: {} frames cannot be made; "
                                 "remove it or give 1",
                                 o.cls, f));
    }
    return;
  }
  if (f > o.max_frames) {
    fail("frames", fmt::format("{} is beyond {}'s limit of {} frames{}", f, o.cls, o.max_frames,
                               o.max_frames_reason.empty() ? std::string() : " (" + o.max_frames_reason + ")"));
  }
  if (o.frame_multiple > 1 && (f - 1) % o.frame_multiple != 0) {
    fail("frames", fmt::format("{} is not {} x k + 1 frames, which {} takes ({}); try {} or {}", f, o.frame_multiple,
                               o.cls, o.frame_multiple_reason, (f - 1) / o.frame_multiple * o.frame_multiple + 1,
                               ((f - 1) / o.frame_multiple + 1) * o.frame_multiple + 1));
  }
}

}  // namespace

void check_request_options(const GenerationRequest& r, const RequestOptions& o, const RequestFail& fail) {
  check_request_bounds(r, fail);
  if (r.max_sequence_length && *r.max_sequence_length > o.max_sequence_length) {
    fail("max_sequence_length", fmt::format("{} is beyond {}'s limit of {} text tokens", *r.max_sequence_length,
                                            o.cls, o.max_sequence_length));
  }
  if (r.steps && *r.steps < o.min_steps) {
    fail("steps", fmt::format("{} is fewer than {} takes ({} at least: {})", *r.steps, o.cls, o.min_steps,
                              o.min_steps_reason));
  }
  check_request_frames(r, o, fail);
  if (r.fps && !o.makes_videos()) {
    fail("fps", fmt::format("{} makes images, not videos: a frame rate applies to frame sequences only; remove it",
                            o.cls));
  }
  if (r.guidance_2 && !o.accepts_guidance_2) {
    fail("guidance_2", fmt::format("{} has no second expert (transformer_2) to guide: guidance_2 applies to two-expert "
                                   "pipelines only (Wan 2.2 A14B); remove it",
                                   o.cls));
  }
  const bool set[] = {r.guidance.has_value(), r.true_cfg_scale.has_value(), r.negative_prompt.has_value()};
  const char* names[] = {"guidance", "true_cfg_scale", "negative_prompt"};
  for (size_t i = 0; i < 3; ++i) {
    if (!set[i]) continue;
    for (const auto& [name, why] : o.unused) {
      if (name == names[i]) fail(name, fmt::format("{} does not use it ({}); remove it", o.cls, why));
    }
  }
}

void need_request_options(const GenerationRequest& r, const RequestOptions& o) {
  check_request_options(r, o, [](const std::string& key, const std::string& what) {
    throw RequestError(fmt::format("{}: {}", key, what), true);
  });
}

void check_max_sequence_length(const GenerationRequest& r, const std::string& cls, int64_t limit) {
  if (*r.max_sequence_length < 1 || *r.max_sequence_length > limit) {
    throw RequestError(fmt::format("max_sequence_length must be in [1, {}] ({}'s limit), got {}", limit, cls,
                                   *r.max_sequence_length),
                       true);
  }
}

void need_given_shape(const GenerationRequest& r, const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& meaning) {
  if (!r.has_given(name)) return;
  const auto got = r.given->at(name).sizes().vec();
  bool ok = got.size() == shape.size();
  // -1: any size but 0 (a text of no tokens, an empty batch are never inputs).
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 ? got[i] > 0 : got[i] == shape[i];
  if (!ok) {
    std::vector<std::string> want;
    for (int64_t s : shape) want.push_back(s < 0 ? std::string("*") : std::to_string(s));
    throw RequestError(fmt::format("given tensor '{}' has shape [{}]; expected [{}] ({}; * is any size from 1)", name,
                                   fmt::join(got, ", "), fmt::join(want, ", "), meaning),
                       true);
  }
}

void check_given_inputs(const models::TensorMap& tensors, const std::string& source) {
  for (const auto& [name, t] : tensors) {
    const auto shape = t.sizes().vec();
    if (t.numel() == 0) {
      throw ConfigError(fmt::format("{}: tensor '{}' has the shape [{}]: no elements{}; give at least one", source,
                                    name, fmt::join(shape, ", "),
                                    name.find("embeds") != std::string::npos ? " (no text tokens)" : ""),
                        true);
    }
    const bool embedding = name.size() >= 6 && name.compare(name.size() - 6, 6, "embeds") == 0;
    if ((embedding || name == "latents") && !at::isFloatingType(t.scalar_type())) {
      throw ConfigError(fmt::format("{}: tensor '{}' is {}, not floating point; it would be converted to the compute "
                                    "dtype as numbers it does not hold",
                                    source, name, c10::toString(t.scalar_type())),
                        true);
    }
  }
}

void need_text_prompts(const GenerationRequest& r) {
  auto check = [](const std::string& text, const char* field) {
    const size_t nul = text.find('\0');
    if (nul != std::string::npos) {
      throw RequestError(fmt::format("{} holds a NUL character (at byte {}); PNG text metadata cannot carry it, so "
                                     "the prompt is refused rather than stored cut short",
                                     field, nul),
                         true);
    }
    text::decode_utf8(text, field);  // RequestError naming the byte offset in this text
  };
  check(r.prompt, "prompt");
  if (r.negative_prompt) check(*r.negative_prompt, "negative_prompt");
}

}  // namespace tprun::pipelines
