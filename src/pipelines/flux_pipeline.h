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
#include <memory>
#include <string>
#include <vector>

#include "models/tensor_map.h"
#include "pipelines/family_steps.h"
#include "pipelines/pipeline.h"

namespace tprun::pipelines {

// Defaults (FluxPipeline.__call__): 1024 x 1024 (default_sample_size 128 x
// vae_scale_factor 8), 28 steps, guidance 3.5, true_cfg_scale 1.0,
// max_sequence_length 512. Tensors a request may give instead of a stage's
// output (GenerationRequest::given), by FluxPipeline's argument names:
// prompt_embeds + pooled_prompt_embeds (then `prompt` is not encoded),
// negative_prompt_embeds + negative_pooled_prompt_embeds, latents (packed
// [1, N, 4C] initial noise; then the seed is not used).
class FluxPipeline final : public RuntimePipeline {
 public:
  static constexpr const char* kClass = "FluxPipeline";

  // `folder`: a diffusers FluxPipeline folder (model_index.json). Reads the
  // configs, checks the components fit together (joint_attention_dim vs T5
  // d_model, pooled_projection_dim vs CLIP hidden size, in_channels vs the
  // VAE's latent channels), validates the transformer's TP plan, then loads.
  // Errors name the folder, component and field. options.denoiser false:
  // every config is read and checked alike, the transformer and the VAE are
  // not loaded (the encode phase of a staged job).
  static std::unique_ptr<FluxPipeline> load(const std::string& folder, const parallel::TpContext& tp,
                                            const PipelineOptions& options = {});

  std::string class_name() const override { return kClass; }
  GenerationRequest with_defaults(GenerationRequest request) const override;
  // RequestError naming the field (height/width not multiples of
  // 2 * vae_scale_factor, steps < 1, missing prompt and embeddings, given
  // tensors of the wrong shape, ...).
  void check_request(const GenerationRequest& request) const override;
  // Size, steps, guidance, true CFG (on/off and scale), max_sequence_length.
  std::string batch_key(const GenerationRequest& request) const override;
  // Pixels x steps x transformer forwards per step.
  double cost(const GenerationRequest& request) const override;
  // Each prompt is encoded and each noise drawn alone, the denoising runs on
  // the stacked latents, each image is checked and decoded alone. Results
  // equal generate()'s to float rounding (GEMMs see a larger batch).
  std::vector<GenerationResult> generate_batch(const std::vector<GenerationRequest>& requests,
                                               const StepCallback& on_step = {}) const override;
  // Packed latents: [image tokens, 4 x latent channels].
  std::vector<int64_t> latent_shape(int64_t height, int64_t width) const override;

  bool decodes() const override;
  int64_t transformer_all_reduces() const override;

  // Staged phases: the prompt's encode gives prompt_embeds and
  // pooled_prompt_embeds; the negative prompt's (true CFG) gives
  // negative_prompt_embeds and negative_pooled_prompt_embeds. encode_text's
  // map holds encode_prompt's tensors on the CPU, and "clip_max_length" next
  // to "clip_tokens_cut" (the CLIP line of warn_truncation, for a pipeline
  // loaded without the tokenizer).
  std::vector<TextEncode> text_encodes(const GenerationRequest& request) const override;
  models::TensorMap encode_text(const TextEncode& encode) const override;
  void warn_truncation(const GenerationRequest& request, const TextEncode& encode,
                       const models::TensorMap& embeddings) const override;

  // The prompt embeddings as FluxPipeline.encode_prompt returns them:
  // {"prompt_embeds" [1, S, joint], "pooled_prompt_embeds" [1, pooled]},
  // through the per-process cache (prompt_cache.h).
  models::TensorMap encode_prompt(const std::string& prompt, int64_t max_sequence_length) const;
  int64_t vae_scale_factor() const;
  bool has_guidance_embeds() const;

  struct Impl;

 protected:
  const PipelineRuntime& runtime() const override;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tprun::pipelines
