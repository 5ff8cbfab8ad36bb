// FluxPipeline: its spec, its load and its hooks into the generate skeleton.
// See flux_pipeline.h for the semantics.
#include "pipelines/flux_pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/clip_text_model.h"
#include "models/model_config.h"
#include "models/t5_encoder.h"
#include "models/vae.h"
#include "pipelines/clip_t5_conditioner.h"
#include "pipelines/component_configs.h"
#include "pipelines/latents.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

models::FluxConfig flux_config(const ComponentConfigs& c) {
  const ComponentConfig& t = c.at("transformer");
  return models::FluxConfig::from_json(t.json, t.path);
}

// CLIP and T5 against the transformer (where the text encoders are read), the VAE's latents against its input.
void flux_cross_check(const ComponentConfigs& c) {
  const models::FluxConfig flux = flux_config(c);
  const std::string& transformer = c.at("transformer").path;
  check_packed_channels(flux.in_channels, transformer, c.vae().latent_channels, c.at("vae").path);
  if (!c.text_encoders()) return;
  const ComponentConfig& clip = c.at("text_encoder");
  const ComponentConfig& t5 = c.at("text_encoder_2");
  const int64_t clip_hidden = models::ClipTextConfig::from_json(clip.json, clip.path).hidden_size;
  const int64_t t5_dim = models::T5Config::from_json(t5.json, t5.path).d_model;
  if (clip_hidden != flux.pooled_dim) {
    throw CheckpointError(fmt::format("{}: pooled_projection_dim {} differs from the CLIP hidden_size {} ({})",
                                      transformer, flux.pooled_dim, clip_hidden, clip.path),
                          true);
  }
  if (t5_dim != flux.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} differs from the T5 d_model {} ({})", transformer,
                                      flux.joint_dim, t5_dim, t5.path),
                          true);
  }
}

FamilyShapes flux_shapes(const ComponentConfigs& c) {
  const models::FluxConfig f = flux_config(c);
  FamilyShapes s;
  s.transformer = {f.heads, f.head_dim, 4 * f.inner(), 4 * f.inner(), f.in_channels, f.joint_dim};
  s.pooled_dim = f.pooled_dim;
  s.text_hidden = f.joint_dim;  // T5's d_model (checked equal)
  return s;
}

// What FluxPipeline's requests may set: 512 T5 tokens; guidance only with a
// guidance embedder (FLUX.1-dev; diffusers passes none to schnell's).
RequestOptions flux_request_options(const checkpoint::PipelineFolder& pf) {
  RequestOptions o;
  o.max_sequence_length = 512;
  std::string path;
  const auto flux =
      models::FluxConfig::from_json(models::read_component_config(need_component(pf, "transformer").path, &path), path);
  if (!flux.guidance) {
    o.unused.emplace_back("guidance", fmt::format("{}: guidance_embeds is false (a FLUX.1-schnell-style transformer)",
                                                  path));
  }
  add_scheduler_request_options(pf, o);
  return o;
}

// The annotations of FluxPipeline.__init__ (pipeline_flux.py): T5 split only when asked.
PipelineSpec flux_spec() {
  PipelineSpec s;
  s.cls = FluxPipeline::kClass;
  ComponentSpec t5 = text_encoder_component("text_encoder_2", {"T5EncoderModel"});
  t5.splittable = true;
  s.components = {
      transformer_component("FluxTransformer2DModel"),
      vae_component({"AutoencoderKL"}),
      scheduler_component({"FlowMatchEulerDiscreteScheduler"}),
      text_encoder_component("text_encoder", {"CLIPTextModel"}),
      t5,
      tokenizer_component("tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"}),
      tokenizer_component("tokenizer_2", {"T5TokenizerFast", "T5Tokenizer"}),
      unused_component("image_encoder", "transformers", {"CLIPVisionModelWithProjection"}),
      unused_component("feature_extractor", "transformers", {"CLIPImageProcessor"}),
  };
  s.defaults.steps = 28;
  s.defaults.guidance = 3.5;
  s.cross_check = flux_cross_check;
  s.shapes = flux_shapes;
  s.request_options = flux_request_options;
  s.tokenize = ClipT5Conditioner::tokenize;
  s.load = [](const std::string& folder, const parallel::TpContext& tp, const PipelineOptions& options) {
    return std::unique_ptr<Pipeline>(FluxPipeline::load(folder, tp, options));
  };
  return s;
}

}  // namespace

std::unique_ptr<FluxPipeline> FluxPipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                 const PipelineOptions& options) {
  auto p = std::unique_ptr<FluxPipeline>(new FluxPipeline());
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const ComponentConfigs configs = p->begin_load(pf, tp, options);
  p->flux_ = flux_config(configs);
  p->text_ = std::make_unique<ClipT5Conditioner>(pf, options.text_encoders, p->flux_.joint_dim, p->flux_.pooled_dim,
                                                 p->ctx_.device, p->ctx_.dtype);
  p->finish_load(pf, configs, options);
  return p;
}

// True CFG: true_cfg_scale > 1 and a negative prompt (or its embeddings) given.
bool FluxPipeline::true_cfg(const GenerationRequest& r) const {
  const bool has_neg = r.negative_prompt.has_value() ||
                       (r.has_given("negative_prompt_embeds") && r.has_given("negative_pooled_prompt_embeds"));
  return *r.true_cfg_scale > 1.0 && has_neg;
}

// mu from the image tokens where the scheduler shifts dynamically; sigmas linspace(1, 1/n, n).
std::optional<double> FluxPipeline::schedule_mu(const FlowMatchEulerDiscreteScheduler& scheduler,
                                                int64_t image_tokens, int64_t steps) const {
  if (!scheduler_.use_dynamic_shifting) return std::nullopt;
  return scheduler.mu_for(image_tokens);
}

// Image ids of the 2x2-packed grid, text ids zeros [S, 3], [guidance] with a guidance embedder (FLUX.1-dev).
void FluxPipeline::add_transformer_inputs(models::TensorMap& in, const GenerationRequest& r, int64_t batch) const {
  const int64_t lh = latent_side(*r.height, vae_scale_), lw = latent_side(*r.width, vae_scale_);
  const auto opts = at::TensorOptions().dtype(ctx_.dtype).device(ctx_.device);
  in["img_ids"] = latent_image_ids(lh / 2, lw / 2, ctx_.dtype, ctx_.device);
  in["txt_ids"] = at::zeros({in.at("encoder_hidden_states").size(1), 3}, opts);
  if (flux_.guidance) {
    in["guidance"] = at::full({batch}, *r.guidance, at::TensorOptions().dtype(at::kFloat).device(ctx_.device));
  }
}

// Unpacked, z / scaling_factor + shift_factor (the VAE's normalisation), decoded in the VAE's dtype.
at::Tensor FluxPipeline::decode_latents(const at::Tensor& packed, int64_t height, int64_t width) const {
  const at::Tensor z = vae_->denormalize(unpack_latents(packed, height, width, vae_scale_));
  return vae_->decode(z.to(checkpoint::parse_compute_dtype(vae_->compute_dtype(), "vae dtype")));
}

TPRUN_REGISTER_PIPELINE_SPEC(flux_spec);

}  // namespace tprun::pipelines
