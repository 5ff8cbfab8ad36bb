#pragma once
// The generate skeleton every flow-matching pipeline family shares (template
// method): the Pipeline interface answered once, with the family's hooks for
// what differs.
//
// Load (load_as<Family>, the spec's `load`):
//   begin         the folder against the spec (component_check.h), every
//                 config and cross-check (component_configs.h), the request
//                 options and the scheduler config; no weight byte yet
//   configure     the family's hook: its typed configs, its text conditioner
//                 with its tokenizers
//   finish        every TP plan, then the weights (component_loader.h); the
//                 transformer, the VAE and the text encoders taken
// One batch (generate_batch):
//   prepare_batch -> memory check -> encode (each prompt given or encoded
//   through the cache, with diffusers' truncation warning) -> latents (each
//   request's given or drawn) -> schedule (the family's mu) -> denoise (the
//   family's inputs; its guidance style: true CFG and its rescale) -> per
//   image: NaN check and decode (the family's latent layout and the VAE's
//   normalisation).
// Hooks: true_cfg / cfg_scale / cfg_rescale (guidance style), draw_latents
// (latent layout), schedule_mu (scheduler shift), add_transformer_inputs
// (ids, guidance, image shapes), decode_latents (unpack, de-normalise,
// decode), check_family_request.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/tensor_map.h"
#include "pipelines/batch_stages.h"
#include "pipelines/pipeline.h"
#include "pipelines/pipeline_context.h"
#include "pipelines/pipeline_spec.h"
#include "pipelines/request_checks.h"
#include "pipelines/scheduler.h"
#include "pipelines/text_conditioner.h"

namespace tprun::checkpoint {
struct PipelineFolder;
}

namespace tprun::models {
class Denoiser;
class Vae;
}  // namespace tprun::models

namespace tprun::pipelines {

class ComponentConfigs;
class FlowMatchEulerDiscreteScheduler;
class LoadedComponents;

class DiffusionPipeline : public Pipeline {
 public:
  ~DiffusionPipeline() override;

  std::string class_name() const override { return cls_; }
  GenerationRequest with_defaults(GenerationRequest request) const override;
  // RequestError naming the field: the request options (request_checks.h),
  // the size against the VAE, steps and guidance, max_sequence_length, the
  // given tensors (together, shapes, known names), the text encoders a
  // request without embeddings needs; then the family's own checks.
  void check_request(const GenerationRequest& request) const override;
  // What changes a batch's compute: size, steps, guidance, true CFG (on and its scale), max_sequence_length.
  std::string batch_key(const GenerationRequest& request) const override;
  // Pixels x steps x transformer forwards per step.
  double cost(const GenerationRequest& request) const override;
  // Each prompt is encoded and each noise drawn alone, the denoising runs on
  // the stacked latents, each image is checked and decoded alone.
  std::vector<GenerationResult> generate_batch(const std::vector<GenerationRequest>& requests,
                                               const StepCallback& on_step = {}) const final;
  // generate_batch's parts (pipeline.h); the stages are the family's
  // (denoise_stages, step_stage), its weights held per stage by hold_stage.
  std::unique_ptr<InFlight> start_batch(const std::vector<GenerationRequest>& requests,
                                        const StepCallback& on_step = {}) const final;
  void advance_batch(InFlight& batch, int64_t stage) const final;
  std::vector<GenerationResult> finish_in_flight(InFlight& batch) const final;
  // Packed latents: [image tokens, in_channels].
  std::vector<int64_t> latent_shape(int64_t height, int64_t width) const override;

  bool decodes() const override;
  const std::string& folder() const override { return ctx_.folder; }
  const std::string& dtype() const override { return ctx_.dtype_name; }
  uint64_t bytes_loaded() const override { return ctx_.bytes; }
  int64_t transformer_all_reduces() const override;
  PromptCacheStats prompt_cache_stats() const override { return ctx_.cache->stats(); }
  // The transformer's adapters and, where the family's diffusers loader takes
  // them, its text encoders' (FLUX.1: CLIP); docs/lora.md.
  void prepare_loras(const std::vector<std::vector<LoraChoice>>& sets, bool strict, const std::string& apply) override;
  lora::LoraStats lora_stats() const override;

  // Staged phases: the prompt's encode gives the conditioner's tensors, the
  // negative prompt's (true CFG; "" unless given) the same as negative_*.
  std::vector<TextEncode> text_encodes(const GenerationRequest& request) const override;
  models::TensorMap encode_text(const TextEncode& encode) const override;
  void warn_truncation(const GenerationRequest& request, const TextEncode& encode,
                       const models::TensorMap& embeddings) const override;

  // One prompt's embeddings as the family's encode_prompt returns them, through the per-process cache.
  models::TensorMap encode_prompt(const std::string& prompt, int64_t max_sequence_length) const;
  int64_t vae_scale_factor() const { return vae_scale_; }

  // A family's load (see the header comment). Errors name the folder,
  // component and field; options.denoiser false: every config is read and
  // checked alike, the transformer and the VAE are not loaded (the encode
  // phase of a staged job).
  template <class Family>
  static std::unique_ptr<Family> load_as(const std::string& folder, const parallel::TpContext& tp,
                                         const PipelineOptions& options) {
    std::unique_ptr<Family> p(new Family());
    p->load_folder(folder, tp, options);
    return p;
  }

 protected:
  DiffusionPipeline();

  // The family's part of the load, before any weight byte: its typed configs
  // from `configs` (read and cross-checked) and its text conditioner (text_).
  virtual void configure(const ComponentConfigs& configs, const PipelineOptions& options) = 0;
  // The family's further components from the load (after the transformer, the VAE and the text encoders).
  virtual void take_more(LoadedComponents& parts) {}

  // Guidance style: whether true CFG runs for `r` (defaults applied), its scale, its rescale.
  virtual bool true_cfg(const GenerationRequest& r) const = 0;
  virtual double cfg_scale(const GenerationRequest& r) const = 0;
  virtual CfgRescale cfg_rescale() const { return CfgRescale::kNone; }
  // Whether the pipeline ever runs a negative pass (negative_* tensors are known).
  virtual bool has_negative() const { return true; }
  // Latent layout: one request's initial noise from its seed, packed [1, tokens, in_channels].
  // Default: FLUX.1's 2x2 packing of in_channels / 4 channels.
  virtual at::Tensor draw_latents(const GenerationRequest& r) const;
  // The dtype the latents are denoised in (a given `latents` is cast to it): the pipeline's (WanPipeline: fp32).
  virtual c10::ScalarType latents_dtype() const { return ctx_.dtype; }
  // Scheduler shift: mu for set_timesteps (nullopt: none).
  virtual std::optional<double> schedule_mu(const Scheduler& scheduler, int64_t image_tokens, int64_t steps) const = 0;
  // Whether the schedule is the scheduler's own (diffusers' set_timesteps(steps) with no sigmas, as
  // WanPipeline calls it) rather than FluxPipeline's sigmas linspace(1, 1/n, n).
  virtual bool scheduler_own_timesteps() const { return false; }
  // How the transformer sees the timestep and the latents (default: t / 1000
  // and the latents as they are, cfg_rescale()).
  virtual DenoiseStyle denoise_style() const;
  // The transformer of the step at scheduler timestep t and its CFG scale
  // (default: the transformer, cfg_scale(r); Wan 2.2 A14B: its experts).
  virtual const models::Denoiser& step_transformer(float t) const;
  virtual double step_cfg_scale(const GenerationRequest& r, float t) const { return cfg_scale(r); }
  // What else changes a batch's compute besides batch_key's fields ("" for none).
  virtual std::string batch_key_extra(const GenerationRequest& r) const { return {}; }
  // A given `latents` tensor, for messages ("packed latents [1, image tokens, in_channels]").
  virtual std::string latents_meaning() const;
  // A decode of the whole batch at once, split over the TP group (every
  // rank holds the VAE); empty: decode_latents per result on the VAE's rank.
  virtual BatchDecoder batch_decoder(int64_t height, int64_t width, int64_t frames) const { return {}; }
  // Denoising stages (Wan 2.2 A14B: its two experts; steps' stages never
  // decrease), the stage of the step at scheduler timestep t, and the stage
  // whose weights to hold before its steps run (a no-op where every weight is resident).
  virtual int64_t denoise_stages() const { return 1; }
  virtual int64_t step_stage(float t) const { return 0; }
  virtual void hold_stage(int64_t stage) const {}
  // The transformer's inputs besides the text's (text_->batch), latents and timestep.
  virtual void add_transformer_inputs(models::TensorMap& inputs, const GenerationRequest& r, int64_t batch) const = 0;
  // One image's packed latents [1, tokens, C] -> decoded [1, 3, H, W] (or [1, 3, F, H, W]) in [-1, 1].
  virtual at::Tensor decode_latents(const at::Tensor& packed, int64_t height, int64_t width) const = 0;
  virtual void check_family_request(const GenerationRequest& r) const {}
  // A component adapters reach was loaded again (hold_stage): the set in force goes onto it.
  void rebind_loras(const std::string& component, const models::Model* model) const;
  // Whether `component` is loaded again during a run (hold_stage), so never fused.
  virtual bool reloads(const std::string& component) const { return false; }

  PipelineContext ctx_;
  std::string cls_;
  const PipelineSpec* spec_ = nullptr;
  RequestOptions request_;
  // scheduler/scheduler_config.json, checked at load; a fresh scheduler per batch.
  nlohmann::json scheduler_config_;
  std::string scheduler_path_, scheduler_fallback_;  // the file; model_index.json's class for a config without one
  std::unique_ptr<Scheduler> make_batch_scheduler() const;
  // `scheduler` as FlowMatchEulerDiscreteScheduler (the families whose spec
  // accepts no other); an internal error otherwise.
  static const FlowMatchEulerDiscreteScheduler& flow_match(const Scheduler& scheduler);
  FamilyShapes shapes_;
  int64_t vae_scale_ = 8;
  std::unique_ptr<TextConditioner> text_;
  // Mutable: a family that holds its experts one stage at a time swaps them (hold_stage).
  mutable std::unique_ptr<models::Denoiser> transformer_;
  int64_t attention_chunk_ = 0;  // the transformer's, as loaded (the memory estimate's)
  std::unique_ptr<models::Vae> vae_;
  // config.json of the components adapters may reach (the transformer, the text encoders).
  std::map<std::string, nlohmann::json> lora_configs_;
  std::unique_ptr<lora::LoraAdapters> loras_;  // after prepare_loras
  // The set in force where adapters reach a text encoder ("" otherwise): a
  // part of every prompt-cache key, so embeddings of other adapters never serve.
  mutable std::string text_lora_key_;
  // Puts `r`'s adapter set in force (generate_batch's parts, before the encode and the steps).
  void use_loras(const GenerationRequest& r) const;

 private:
  void load_folder(const std::string& folder, const parallel::TpContext& tp, const PipelineOptions& options);

  struct TextInputs {
    models::TensorMap positive, negative;
  };
  struct BatchRun;
  TextInputs encode_batch(const std::vector<GenerationRequest>& rs, bool cfg) const;
  void check_batch_fits(const std::vector<GenerationRequest>& rs) const;
};

// A family's load as its spec holds it (PipelineSpec::load).
template <class Family>
std::unique_ptr<Pipeline> load_family(const std::string& folder, const parallel::TpContext& tp,
                                      const PipelineOptions& options) {
  return DiffusionPipeline::load_as<Family>(folder, tp, options);
}

// The key of a prompt's embeddings, in the embeddings cache and in a
// TextEncode: max_sequence_length and the text, not the role, so a negative
// prompt "" and a prompt "" share one encode.
std::string prompt_key(const std::string& text, int64_t max_sequence_length);

}  // namespace tprun::pipelines
