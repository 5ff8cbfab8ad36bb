#pragma once
// diffusers' Flux2Pipeline (FLUX.2 [dev]) and Flux2KleinPipeline (FLUX.2
// [klein]) text to image over tprun's components, one object per process:
// the Flux2 transformer sharded over the TP group, the decoder-only text
// encoder (klein: Qwen3; dev: the language model of Mistral-Small 3.x)
// sharded over the TP group too unless PipelineOptions says otherwise (a 24B
// encoder replicated on every rank does not fit most GPUs), the
// AutoencoderKLFlux2 on TP rank 0 only (the rank that writes images).
//
// One request runs as the diffusers pipelines' __call__ for one prompt:
//   encode    klein: the Qwen3 chat template (user message, generation prompt,
//             thinking off); dev: Mistral's template with the FLUX.2 system
//             message. Padded to max_sequence_length (default 512), the
//             text encoder's hidden states of layers (9, 18, 27) (klein) /
//             (10, 20, 30) (dev) stacked into [1, S, 3 * hidden]; text ids
//             (0, 0, 0, l). Embeddings are kept per (prompt,
//             max_sequence_length) in a bounded cache (prompt_cache.h).
//   latents   seeded noise drawn in the patchified shape (flux2_latents.h).
//   schedule  sigmas linspace(1, 1/n, n), mu = compute_empirical_mu(tokens, n).
//   denoise   per step: transformer(latents, t / 1000, text, ids); dev passes
//             the distilled guidance embedding `guidance`; klein runs true CFG
//             with the empty negative prompt when the folder is not distilled
//             (model_index.json "is_distilled") and guidance > 1:
//             neg + guidance * (cond - neg); Euler step.
//   decode    unpack, de-normalise with the VAE's latent batch-norm
//             statistics, unpatchify, VAE decode, clamp(x / 2 + 0.5, 0, 1),
//             uint8 = round(x * 255).
// Defaults (both pipelines' __call__): 1024 x 1024 (default_sample_size 128
// x vae_scale_factor), 50 steps, guidance 4.0, max_sequence_length 512.
// Tensors a request may give instead of a stage's output
// (GenerationRequest::given): prompt_embeds, negative_prompt_embeds (klein),
// latents (packed [1, tokens, in_channels] initial noise).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "pipelines/diffusion_pipeline.h"

namespace tprun::pipelines {

class Flux2Pipeline final : public DiffusionPipeline {
 public:
  static constexpr const char* kClass = "Flux2Pipeline";            // FLUX.2 [dev]
  static constexpr const char* kKleinClass = "Flux2KleinPipeline";  // FLUX.2 [klein]

  bool klein() const { return klein_; }

 private:
  void configure(const ComponentConfigs& configs, const PipelineOptions& options) override;
  // klein: true CFG with guidance as its scale when the folder is not distilled and guidance > 1.
  bool true_cfg(const GenerationRequest& r) const override;
  double cfg_scale(const GenerationRequest& r) const override { return *r.guidance; }
  bool has_negative() const override { return klein_; }
  at::Tensor draw_latents(const GenerationRequest& r) const override;
  std::optional<double> schedule_mu(const Scheduler& scheduler, int64_t image_tokens, int64_t steps) const override;
  void add_transformer_inputs(models::TensorMap& inputs, const GenerationRequest& r, int64_t batch) const override;
  at::Tensor decode_latents(const at::Tensor& packed, int64_t height, int64_t width) const override;

  bool klein_ = false, distilled_ = false;
};

}  // namespace tprun::pipelines
