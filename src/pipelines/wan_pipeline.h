#pragma once
// diffusers' WanPipeline (Wan-AI/Wan2.1-T2V-1.3B / 14B-Diffusers, and
// Wan2.2-T2V-A14B-Diffusers with its two experts) text to video over tprun's
// components: the WanTransformer3DModel(s) split over the TP group, the
// UMT5 encoder split over it too unless PipelineOptions says otherwise, the
// AutoencoderKLWan decoder on every rank of the group, which split each
// batch's decode between them.
//
// One request runs as WanPipeline.__call__ for one prompt:
//   encode    prompt_clean, UMT5 over max_sequence_length (512) tokens, the
//             embeddings trimmed to the prompt's tokens and zero-padded back
//             (wan_conditioner.h); with CFG (guidance > 1) the negative
//             prompt the same way ("" unless given).
//   latents   seeded fp32 noise [1, C, (frames - 1) / 4 + 1, h / 8, w / 8]
//             (C = the transformer's in_channels), drawn as
//             torch.randn(shape, generator=Generator("cpu").manual_seed(seed)).
//   schedule  the folder's scheduler (UniPCMultistepScheduler with flow
//             sigmas, or FlowMatchEulerDiscreteScheduler) set for `steps`.
//   denoise   per step t: the expert of t (Wan 2.2 A14B: `transformer` for
//             t >= boundary_ratio x num_train_timesteps, else
//             `transformer_2`), fed the fp32 latents cast to the pipeline's
//             dtype and timestep t itself (not t / 1000); with CFG
//             uncond + s x (cond - uncond), s = guidance, or guidance_2 for
//             the second expert (default: guidance); the scheduler steps the
//             fp32 latents. CFG runs when guidance > 1, whatever guidance_2.
//   decode    latents / (1 / latents_std) + latents_mean in the VAE's
//             dtype, AutoencoderKLWan decode (one latent frame at a time,
//             1 + 4 (F - 1) frames), the batch's videos (or one tiled
//             video's tiles) split over the TP group, clamp(x / 2 + 0.5).
// Defaults: 480 x 832, 81 frames, 50 steps, guidance 5.0, max_sequence_length 512.
// A request may give prompt_embeds [1, S, text_dim], negative_prompt_embeds
// and latents [1, C, F', h, w] instead of a stage's output.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/model.h"
#include "pipelines/component_configs.h"
#include "pipelines/diffusion_pipeline.h"

namespace tprun::pipelines {

class WanPipeline final : public DiffusionPipeline {
 public:
  static constexpr const char* kClass = "WanPipeline";

  std::vector<int64_t> latent_shape(int64_t height, int64_t width) const override;
  // [C, (frames - 1) / 4 + 1, height / 8, width / 8].
  std::vector<int64_t> request_latent_shape(const GenerationRequest& request) const override;
  // Latent frames x (h / 2) x (w / 2): the transformer's patches.
  int64_t latent_tokens(const GenerationRequest& request) const override;
  int64_t weight_stages() const override { return staged_ ? 2 : 1; }
  // The second expert (nullptr: Wan 2.1, one transformer, or staged and not held).
  const models::Denoiser* transformer_2() const { return transformer_2_.get(); }
  // boundary_ratio x num_train_timesteps (nullopt: one transformer).
  std::optional<double> boundary_timestep() const { return boundary_; }

 private:
  void configure(const ComponentConfigs& configs, const PipelineOptions& options) override;
  void take_more(LoadedComponents& parts) override;
  bool true_cfg(const GenerationRequest& r) const override;
  double cfg_scale(const GenerationRequest& r) const override { return *r.guidance; }
  std::optional<double> schedule_mu(const Scheduler&, int64_t, int64_t) const override { return std::nullopt; }
  DenoiseStyle denoise_style() const override;
  bool scheduler_own_timesteps() const override { return true; }
  const models::Denoiser& step_transformer(float t) const override;
  double step_cfg_scale(const GenerationRequest& r, float t) const override;
  std::string batch_key_extra(const GenerationRequest& r) const override;
  std::string latents_meaning() const override;
  at::Tensor draw_latents(const GenerationRequest& r) const override;
  c10::ScalarType latents_dtype() const override { return c10::kFloat; }
  void add_transformer_inputs(models::TensorMap&, const GenerationRequest&, int64_t) const override {}
  at::Tensor decode_latents(const at::Tensor& latents, int64_t height, int64_t width) const override;
  BatchDecoder batch_decoder(int64_t height, int64_t width, int64_t frames) const override;
  void check_family_request(const GenerationRequest& r) const override;
  // Two experts: stage 0 the high-noise steps (transformer), stage 1 the
  // low-noise ones (transformer_2). Staged (PipelineOptions::stage_experts):
  // one expert held at a time, the other loaded (and the held one freed)
  // by hold_stage.
  int64_t denoise_stages() const override { return boundary_ ? 2 : 1; }
  int64_t step_stage(float t) const override { return second_expert(t) ? 1 : 0; }
  bool reloads(const std::string& component) const override { return staged_ && component == "transformer"; }
  void hold_stage(int64_t stage) const override;
  // Whether step t runs the second expert.
  bool second_expert(float t) const;
  // The latents in the VAE's dtype with its statistics undone.
  at::Tensor denormalized(const at::Tensor& latents) const;

  mutable std::unique_ptr<models::Denoiser> transformer_2_;
  // Staged experts: what hold_stage loads (each expert's config and load options) and the stage held.
  bool staged_ = false;
  std::string variant_;
  ComponentConfig expert_config_[2];
  models::ModelOptions expert_options_[2];
  mutable int64_t held_stage_ = 0;
  std::optional<double> boundary_;  // boundary_ratio x num_train_timesteps
  int64_t in_channels_ = 16, temporal_scale_ = 4;
};

}  // namespace tprun::pipelines
