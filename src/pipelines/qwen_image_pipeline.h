#pragma once
// diffusers' QwenImagePipeline (Qwen/Qwen-Image, Qwen-Image-2512) text to
// image over tprun's components, one object per process: the
// QwenImageTransformer2DModel sharded over the TP group, the Qwen2.5-VL
// language model as text encoder sharded over the TP group too unless
// PipelineOptions says otherwise (its vision tower and lm_head never read),
// the AutoencoderKLQwenImage decoder on TP rank 0 only.
//
// One request runs as QwenImagePipeline.__call__ for one prompt:
//   encode    the prompt in the pipeline's fixed template
//             (qwen_image_defaults.h), tokenized and truncated to 1024 + 34
//             tokens, the encoder's last hidden state (after its final
//             norm), the first 34 tokens dropped, then cut to
//             max_sequence_length (default 512, at most 1024). A batch pads
//             its prompts' embeddings to the longest with zeros and passes
//             the mask (1 = a real token) to the transformer; a batch whose
//             prompts are all of one length passes none, as diffusers does.
//   latents   seeded noise [1, 1, C, h, w] (C = in_channels / 4), 2x2-packed
//             as FluxPipeline packs (the same values as FLUX.1's draw).
//   schedule  sigmas linspace(1, 1/n, n), mu = calculate_shift(image tokens)
//             with the scheduler config's base/max sequence lengths and shifts
//             (Qwen-Image: shift_terminal 0.02, exponential time shift).
//   denoise   per step: transformer(latents, t / 1000, text, text mask,
//             img_shapes (1, h/2, w/2)); with a negative prompt and
//             true_cfg_scale > 1: comb = neg + s * (cond - neg), rescaled per
//             token to |cond| / |comb|; Euler step. `guidance` is never
//             passed: diffusers 0.40.0 reads guidance_embeds but builds no
//             guidance embedder (its forward refuses the argument), so a
//             request that sets guidance is refused (request_checks.h).
//   decode    unpack to [1, C, 1, h, w], latents * std + mean (the VAE
//             config's latents_std / latents_mean, computed as diffusers:
//             latents / (1 / std) + mean), VAE decode of the one frame,
//             clamp(x / 2 + 0.5, 0, 1), uint8 = round(x * 255).
// Defaults: 1024 x 1024, 50 steps, true_cfg_scale 4.0, max_sequence_length
// 512, no guidance. Tensors a request may give instead of a stage's output
// (GenerationRequest::given): prompt_embeds [1, S, joint_attention_dim] with
// optional prompt_embeds_mask [1, S], negative_prompt_embeds with optional
// negative_prompt_embeds_mask, latents (packed [1, tokens, in_channels]).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "pipelines/diffusion_pipeline.h"

namespace tprun::pipelines {

class QwenImagePipeline final : public DiffusionPipeline {
 public:
  static constexpr const char* kClass = "QwenImagePipeline";

 private:
  void configure(const ComponentConfigs& configs, const PipelineOptions& options) override;
  // True CFG: true_cfg_scale > 1 and a negative prompt (or its embeddings) given; norm rescale.
  bool true_cfg(const GenerationRequest& r) const override;
  double cfg_scale(const GenerationRequest& r) const override { return *r.true_cfg_scale; }
  CfgRescale cfg_rescale() const override { return CfgRescale::kCondNorm; }
  std::optional<double> schedule_mu(const Scheduler& scheduler, int64_t image_tokens, int64_t steps) const override;
  void add_transformer_inputs(models::TensorMap& inputs, const GenerationRequest& r, int64_t batch) const override;
  at::Tensor decode_latents(const at::Tensor& packed, int64_t height, int64_t width) const override;
};

}  // namespace tprun::pipelines
