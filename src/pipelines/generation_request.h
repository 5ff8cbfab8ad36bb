#pragma once
// One generation request (an image, or a frame sequence where the pipeline
// makes them): what a user asks for, whether it comes from
// `tprun generate`'s flags, a manifest's [defaults] or a line of a requests
// file. Fields left unset take the pipeline's own default
// (Pipeline::with_defaults: diffusers' __call__ defaults for that pipeline),
// so there is exactly one place for defaults. Torch-free: the request parser
// (and its fuzz target) include it.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lora/lora_choice.h"
#include "models/tensor_map.h"

namespace tprun::pipelines {

// Bounds every way of asking shares (a requests file, a manifest's
// [defaults] and [output], `tprun plan`'s flags), so sizes multiplied
// together stay far inside 64 bits.
constexpr int64_t kMaxImageSide = 16384;        // height, width in pixels
// Frames of one result (an image is 1): 4096 x 16384^2 x 3 bytes is 3.3 TB,
// so F x H x W x 3 x 4 (float) x kMaxBatchSize stays inside 64 bits.
constexpr int64_t kMaxFrames = 4096;
constexpr int64_t kMaxBatchSize = 1024;         // requests denoised together (output.batch_size)
constexpr int64_t kMaxStageRequests = 100000000;  // requests whose embeddings a staged round keeps

using lora::LoraChoice;

struct GenerationRequest {
  std::string id;  // the job's request id, for log lines only ("" for `tprun generate`)
  std::string prompt;
  std::optional<std::string> negative_prompt;  // used with true CFG (true_cfg_scale > 1)
  std::optional<int64_t> height, width;        // pixels
  std::optional<int64_t> steps;
  std::optional<double> guidance;        // distilled guidance (models with guidance_embeds)
  std::optional<double> true_cfg_scale;  // > 1 with a negative prompt: true classifier-free guidance
  std::optional<int64_t> max_sequence_length;
  // Frames of the result, [F, H, W, 3]. Unset: the pipeline's default (an
  // image pipeline's is 1 and it refuses any other: request_checks.h).
  std::optional<int64_t> frames;
  // Frames per second a video result plays at (its MP4, its results-log
  // line, its HDF5 attribute). Unset: the pipeline's default
  // (RequestOptions::default_fps); an image pipeline refuses it by name.
  std::optional<int64_t> fps;
  // The second expert's guidance scale (diffusers' guidance_scale_2: Wan 2.2
  // A14B's low-noise transformer_2); only pipelines whose RequestOptions
  // accept it take it, others refuse it by name.
  std::optional<double> guidance_2;
  // The adapters this request runs with, summed in order. Unset: the job's
  // set (a manifest's [[loras]], `generate --lora`); an empty list: none.
  // Requests with different sets are never denoised in one batch.
  std::optional<std::vector<LoraChoice>> loras;
  uint64_t seed = 0;
  // Tensors that replace a stage's output, by the pipeline's argument names
  // (prompt_embeds, latents, ...; each pipeline's header lists them). Null: none.
  std::shared_ptr<const models::TensorMap> given;

  bool has_given(const std::string& name) const;  // generation_request.cpp
  int64_t frame_count() const { return frames.value_or(1); }

  // Fills every unset field from `defaults` (the prompt and seed are not defaults).
  void fill_from(const GenerationRequest& defaults) {
    auto fill = [](auto& field, const auto& fallback) {
      if (!field) field = fallback;
    };
    fill(negative_prompt, defaults.negative_prompt);
    fill(height, defaults.height);
    fill(width, defaults.width);
    fill(steps, defaults.steps);
    fill(guidance, defaults.guidance);
    fill(true_cfg_scale, defaults.true_cfg_scale);
    fill(max_sequence_length, defaults.max_sequence_length);
    fill(frames, defaults.frames);
    fill(fps, defaults.fps);
    fill(guidance_2, defaults.guidance_2);
    fill(loras, defaults.loras);
  }
  // The adapters in force (none when unset).
  const std::vector<LoraChoice>& lora_set() const {
    static const std::vector<LoraChoice> kNone;
    return loras ? *loras : kNone;
  }
};

// The bounds every numeric request value is held to, wherever it comes from
// (`generate`'s flags, a manifest's [defaults], a requests file), before
// any use: one table, so no value can overflow an image size, a float or a
// step count further on. Each pipeline narrows some of them once it is known
// (max_sequence_length to its text encoder's limit, steps to what its
// scheduler can stretch: request_checks.h).
struct RequestBound {
  const char* key;  // "height", "width", "steps", "guidance", "true_cfg_scale", "max_sequence_length", "frames",
                    // "fps", "guidance_2"
  double lo, hi;
  bool integer;
};
// The known keys; Error (internal) for any other.
const RequestBound& request_bound(const std::string& key);
// The widest max_sequence_length any pipeline takes is its own limit; this
// outer bound only keeps the number sane before the pipeline is known.
constexpr int64_t kMaxSequenceLengthBound = 1 << 16;
// Frames per second of a video (the fps key): 1 to 240.
constexpr int64_t kMaxFps = 240;

// `fail(key, what)` (which throws) for the first set field of `r` outside
// its bound, `what` as "9223372036854775792 is outside [1, 16384]".
using RequestFail = std::function<void(const std::string& key, const std::string& what)>;
void check_request_bounds(const GenerationRequest& r, const RequestFail& fail);
// "x is outside [lo, hi]" for one value (integers as written).
std::string outside_bound(const RequestBound& bound, double value);
std::string outside_bound(const RequestBound& bound, int64_t value);

// A request's parameters as PNG text chunks, in this order: Software, prompt,
// negative_prompt (when set), seed, height, width, steps, guidance,
// true_cfg_scale, guidance_2, max_sequence_length, frames and fps (only
// above 1 frame: an image's text is what it always was), one "lora" per
// adapter ("<scale> <path>"), model, dtype. Unset fields are left out.
std::vector<std::pair<std::string, std::string>> generation_text(const GenerationRequest& request,
                                                                  const std::string& model, const std::string& dtype);

}  // namespace tprun::pipelines
