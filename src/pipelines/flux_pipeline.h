#pragma once
// diffusers' FluxPipeline (text to image) over tprun's components, as one
// object per process: the transformer sharded over the TP group, the CLIP and
// T5 text encoders replicated (T5 optionally sharded with its own plan), the
// VAE on TP rank 0 only (the one rank that writes images).
//
// One request runs as FluxPipeline.__call__ does for one prompt:
//   encode    CLIP pooled output (tokenizer/, 77 ids) -> pooled_prompt_embeds,
//             T5 last_hidden_state (tokenizer_2/, max_sequence_length ids)
//             -> prompt_embeds; text ids zeros [S, 3]. The same for the
//             negative prompt when true CFG is on (true_cfg_scale > 1 and a
//             negative prompt given).
//   latents   seeded CPU noise (pipelines/latents.h), packed 2x2.
//   schedule  sigmas = linspace(1, 1/n, n), mu from the image sequence length
//             and scheduler/scheduler_config.json (never assumed).
//   denoise   per step: transformer(latents, t / 1000, guidance, pooled,
//             prompt_embeds, txt_ids, img_ids); guidance = [guidance] when the
//             transformer has guidance_embeds (FLUX.1-dev), none otherwise
//             (FLUX.1-schnell); true CFG: neg + scale * (cond - neg); Euler step.
//   decode    unpack, z / scaling_factor + shift_factor, VAE decode,
//             clamp(x / 2 + 0.5, 0, 1) (VaeImageProcessor.postprocess), NHWC,
//             uint8 = round(x * 255).
// Every rank of the TP group runs the same request and holds the same
// latents; requests are validated (size, steps, prompt) before any compute,
// identically on every rank, so a bad request fails everywhere at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/tensor_map.h"
#include "parallel/tp_context.h"

namespace at {
class Tensor;
}

namespace tprun::pipelines {

struct PipelineLoadOptions {
  std::string dtype = "fp32";  // compute dtype of every component: fp32 | bf16 | fp16
  std::string device = "cpu";
  std::string variant;         // weights variant ("fp16": *.fp16.safetensors)
  bool shard_text_encoder_2 = false;  // T5 over the TP group (its tp plan)
  bool shard_modulation = false;      // transformer AdaLN modulations rowwise_split_input
  bool text_encoders = true;          // false: requests must give prompt embeddings
  bool decode_on_every_rank = false;  // default: TP rank 0 only loads the VAE and decodes
};

struct GenerationRequest {
  std::string prompt;
  std::optional<std::string> negative_prompt;
  int64_t height = 1024, width = 1024;  // diffusers: default_sample_size 128 * vae_scale_factor 8
  int64_t steps = 28;
  double guidance = 3.5;        // distilled guidance (ignored by models without guidance_embeds)
  double true_cfg_scale = 1.0;  // > 1 with a negative prompt: true classifier-free guidance
  uint64_t seed = 0;
  int64_t max_sequence_length = 512;
  // Tensors that replace a stage's output, by FluxPipeline's argument names:
  // prompt_embeds + pooled_prompt_embeds (then `prompt` is not encoded),
  // negative_prompt_embeds + negative_pooled_prompt_embeds, latents (packed
  // [1, N, 4C] initial noise; then the seed is not used).
  models::TensorMap given;
};

struct StageTimes {
  double encode_s = 0;
  std::vector<double> step_s;
  double decode_s = 0;
  double denoise_s() const;
  double total_s() const { return encode_s + denoise_s() + decode_s; }
};

struct GenerationResult {
  std::shared_ptr<at::Tensor> latents;  // final packed latents [1, N, 4C], compute dtype
  std::shared_ptr<at::Tensor> image;    // [1, H, W, 3] float32 in [0, 1] on the CPU; null where not decoded
  std::vector<uint8_t> rgb;             // H * W * 3 bytes, round(image * 255); empty where not decoded
  int64_t height = 0, width = 0;
  StageTimes times;       // this image's share of its batch's stage times
  int64_t batch_size = 1;  // images generated together with this one
  std::string error;       // generate_batch: why this image failed (NaN/Inf latents); "" = ok
  bool decoded() const { return !rgb.empty(); }
};

// A request's parameters as PNG text chunks, in this order: Software, prompt,
// negative_prompt (when set), seed, height, width, steps, guidance,
// true_cfg_scale, max_sequence_length, model, dtype.
std::vector<std::pair<std::string, std::string>> generation_text(const GenerationRequest& request,
                                                                  const std::string& model, const std::string& dtype);

// Called after each denoising step (step index, steps, seconds of that step).
using StepCallback = std::function<void(int64_t step, int64_t steps, double seconds)>;

class FluxPipeline {
 public:
  // `folder`: a diffusers FluxPipeline folder (model_index.json). Reads the
  // configs, checks the components fit together (joint_attention_dim vs T5
  // d_model, pooled_projection_dim vs CLIP hidden size, in_channels vs the
  // VAE's latent channels), validates the transformer's TP plan, then loads.
  // Errors name the folder, component and field.
  static FluxPipeline load(const std::string& folder, const parallel::TpContext& tp,
                           const PipelineLoadOptions& options = {});

  // RequestError naming the field (height/width not multiples of
  // 2 * vae_scale_factor, steps < 1, missing prompt and embeddings, given
  // tensors of the wrong shape, ...). Pure: no compute, no communication.
  void check_request(const GenerationRequest& request) const;

  // Runs one request (check_request first). A NaN or Inf in the final latents
  // is a RequestError (raised on every rank of the group alike).
  GenerationResult generate(const GenerationRequest& request, const StepCallback& on_step = {}) const;

  // Several requests of one shape (size, steps, guidance, true CFG, max
  // sequence length) as one batch through the transformer: each prompt is
  // encoded and each noise drawn alone, the denoising runs on the stacked
  // latents, each image is checked and decoded alone. An image whose latents
  // hold NaN/Inf gets `error` set; the others are unaffected. RequestError
  // (check_request) for a bad request; internal error for mixed shapes.
  // Results equal generate()'s to float rounding (GEMMs see a larger batch).
  std::vector<GenerationResult> generate_batch(const std::vector<GenerationRequest>& requests,
                                               const StepCallback& on_step = {}) const;

  // The prompt embeddings as FluxPipeline.encode_prompt returns them:
  // {"prompt_embeds" [1, S, joint], "pooled_prompt_embeds" [1, pooled]}.
  models::TensorMap encode_prompt(const std::string& prompt, int64_t max_sequence_length) const;

  int64_t vae_scale_factor() const;
  // Shape [tokens, channels] of the packed latents of a height x width image.
  std::vector<int64_t> packed_latent_shape(int64_t height, int64_t width) const;
  bool has_guidance_embeds() const;
  bool decodes() const;  // this rank loads the VAE and decodes
  const std::string& folder() const;
  const std::string& dtype() const;
  uint64_t bytes_loaded() const;
  // AllReduces per transformer forward and per T5 forward on the TP group.
  int64_t transformer_all_reduces() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tprun::pipelines
