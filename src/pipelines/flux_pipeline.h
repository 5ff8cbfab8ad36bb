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
#include <optional>
#include <string>

#include "models/flux_transformer.h"
#include "pipelines/diffusion_pipeline.h"

namespace tprun::pipelines {

// Defaults (FluxPipeline.__call__): 1024 x 1024 (default_sample_size 128 x
// vae_scale_factor 8), 28 steps, guidance 3.5, true_cfg_scale 1.0,
// max_sequence_length 512. Tensors a request may give instead of a stage's
// output (GenerationRequest::given), by FluxPipeline's argument names:
// prompt_embeds + pooled_prompt_embeds (then `prompt` is not encoded),
// negative_prompt_embeds + negative_pooled_prompt_embeds, latents (packed
// [1, N, 4C] initial noise; then the seed is not used).
class FluxPipeline final : public DiffusionPipeline {
 public:
  static constexpr const char* kClass = "FluxPipeline";

  // `folder`: a diffusers FluxPipeline folder (model_index.json). Reads the
  // configs, checks the components fit together (joint_attention_dim vs T5
  // d_model, pooled_projection_dim vs CLIP hidden size, in_channels vs the
  // VAE's latent channels), validates the TP plans, then loads. Errors name
  // the folder, component and field. options.denoiser false: every config
  // is read and checked alike, the transformer and the VAE are not loaded
  // (the encode phase of a staged job).
  static std::unique_ptr<FluxPipeline> load(const std::string& folder, const parallel::TpContext& tp,
                                            const PipelineOptions& options = {});

  bool has_guidance_embeds() const { return flux_.guidance; }

 private:
  void configure(const ComponentConfigs& configs, const PipelineOptions& options) override;
  bool true_cfg(const GenerationRequest& r) const override;
  double cfg_scale(const GenerationRequest& r) const override { return *r.true_cfg_scale; }
  std::optional<double> schedule_mu(const Scheduler& scheduler, int64_t image_tokens, int64_t steps) const override;
  void add_transformer_inputs(models::TensorMap& inputs, const GenerationRequest& r, int64_t batch) const override;
  at::Tensor decode_latents(const at::Tensor& packed, int64_t height, int64_t width) const override;

  models::FluxConfig flux_;  // the transformer's config, read whether or not it is loaded
};

}  // namespace tprun::pipelines
