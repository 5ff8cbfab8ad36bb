#pragma once
// The stages of generate_batch that every flow-matching text-to-image
// pipeline shares, whatever its encoders, latents and conditioning:
//   prepare_batch   check each request, fill its defaults, refuse mixed batch keys
//   stack_batch     per-request tensors (embeddings, latents) as one batch
//   denoise         the scheduler loop, with CFG when a negative input is given, a transformer per step
//   finish_batch    per result: NaN/Inf check, decode (an image or frames), 8-bit RGB; stage times shared
// A family supplies only what differs: its transformer call and its decoder.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "models/tensor_map.h"
#include "pipelines/pipeline.h"

namespace tprun::pipelines {

// Every request checked (RequestError) and given the pipeline's defaults;
// internal error when two requests have different batch keys.
std::vector<GenerationRequest> prepare_batch(const Pipeline& pipeline, const std::vector<GenerationRequest>& requests);

// The tensors concatenated on dim 0 (one tensor stays as it is);
// RequestError "the <what> of a batch differ in shape" otherwise.
at::Tensor stack_batch(const std::vector<at::Tensor>& tensors, const char* what);

using TransformerCall = std::function<at::Tensor(const models::TensorMap& inputs)>;

// How true CFG's combined prediction is finished. kNone: as it is (FLUX.1,
// FLUX.2 klein). kCondNorm: rescaled per token to the conditional
// prediction's L2 norm over the channels, comb * (|pos| / |comb|)
// (QwenImagePipeline).
enum class CfgRescale { kNone, kCondNorm };

// What one denoising step runs: the transformer (Wan 2.2 A14B: the expert
// of this timestep) and, with CFG, its scale.
struct DenoiseStep {
  const TransformerCall* transformer = nullptr;
  double cfg_scale = 1.0;
};
// The step plan: step i at scheduler timestep t.
using StepPlan = std::function<DenoiseStep(int64_t i, float t)>;
// One scheduler step: (prediction, step index, latents) -> latents.
using SchedulerStep = std::function<at::Tensor(const at::Tensor& prediction, int64_t i, const at::Tensor& latents)>;

// How the transformer sees the timestep and the latents.
struct DenoiseStyle {
  // true: t / 1000 in the latents' dtype (the flow-matching MMDiTs); false:
  // the scheduler's t itself in fp32 (WanPipeline passes t.expand(batch)).
  bool timestep_thousandths = true;
  // hidden_states cast to this dtype each step while the latents stay in
  // their own (WanPipeline: fp32 latents, the transformer's dtype in); nullopt: as they are.
  std::optional<c10::ScalarType> input_dtype;
  CfgRescale rescale = CfgRescale::kNone;
};

// The denoising loop over `timesteps`, steps [first, end) (end -1: all):
// `inputs` gets hidden_states and timestep (batch-sized) each step. With
// `negative_inputs` non-null, CFG: neg + scale * (pos - neg), then the
// style's rescale. Appends each step's seconds to times.step_s and calls
// on_step(i, total steps). Returns the latents after step end - 1.
at::Tensor denoise(const StepPlan& plan, const std::vector<float>& timesteps, const SchedulerStep& step,
                   at::Tensor latents, models::TensorMap& inputs, models::TensorMap* negative_inputs,
                   const DenoiseStyle& style, const StepCallback& on_step, StageTimes& times, int64_t first = 0,
                   int64_t end = -1);

// One result's packed latents [1, tokens, C] -> the decoded image [1, 3, H, W]
// or frames [1, 3, F, H, W] (a video VAE's layout), in [-1, 1] (any float dtype).
using LatentDecoder = std::function<at::Tensor(const at::Tensor& packed_latents)>;

// What a NaN/Inf result says about a dtype: fp16 and bf16 suggest a wider
// one; fp32 points at the inputs (weights, given tensors, scheduler config).
std::string non_finite_hint(const std::string& dtype_name);

// Per result of the batch: latents with NaN/Inf get `error` (naming steps,
// dtype and non_finite_hint), the others keep their latents and, when
// `decode` is set, their frames as float [F, H, W, 3] in [0, 1] (an image:
// [1, H, W, 3]), round(255 x) bytes and `frames` = F. Each result is charged
// an equal share of the batch's stage times (decode included). Internal
// error for a decoder output of another shape.
std::vector<GenerationResult> finish_batch(const at::Tensor& latents, int64_t height, int64_t width, int64_t steps,
                                           const std::string& dtype_name, const LatentDecoder& decode,
                                           StageTimes times);

// A batch's latents (the results without NaN/Inf, stacked on dim 0) ->
// decoded [n, 3, H, W] or [n, 3, F, H, W] in [-1, 1], called on every rank
// of a decode split over the TP group; an undefined tensor on a rank that
// gets no output.
using BatchDecoder = std::function<at::Tensor(const at::Tensor& latents)>;

// finish_batch with one decode of every finite result together (`decode`
// set on every rank that joins it; results get frames only where it gives them).
std::vector<GenerationResult> finish_batch_together(const at::Tensor& latents, int64_t height, int64_t width,
                                                    int64_t steps, const std::string& dtype_name,
                                                    const BatchDecoder& decode, StageTimes times);

// The tokens a prompt lost to truncation, carried next to its embeddings in
// encode_prompt's (cached) TensorMap under `key`; 0 when there is none.
void note_tokens_cut(models::TensorMap& embeds, const std::string& key, int64_t untruncated, int64_t max_length);
int64_t tokens_cut(const models::TensorMap& embeds, const std::string& key);

// diffusers' truncation warning ("The following part of your input was
// truncated because `max_sequence_length` is set to N tokens"), with the
// number of tokens cut instead of their text: one line per request and text
// (prompt / negative_prompt) when `cut` > 0, naming the request id, logged
// where `leader` (TP rank 0) so a TP group says it once. `because`: diffusers'
// reason ("`max_sequence_length` is set to 512 tokens").
void warn_truncated(const GenerationRequest& request, const char* field, const std::string& because, int64_t cut,
                    bool leader);
// warn_truncated because "`max_sequence_length` is set to N tokens", with
// the tokens cut that an encode noted under `key` (note_tokens_cut) in
// `encoded`: FLUX.1's T5, FLUX.2's and Wan's prompts alike.
void warn_max_sequence_truncated(const GenerationRequest& request, const char* field, int64_t max_sequence_length,
                                 const models::TensorMap& encoded, const std::string& key, bool leader);

// Each request's `name` tensor as one batch (stack_batch), named
// prefix + name in messages ("negative_prompt_embeds"): the text inputs a
// conditioner's batch gives the transformer.
at::Tensor stack_text(const std::vector<models::TensorMap>& per_request, const std::string& name,
                      const std::string& prefix);

}  // namespace tprun::pipelines
