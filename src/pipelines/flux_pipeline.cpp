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
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/latents.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

// CLIP and T5 against the transformer, where the text encoders are read.
void flux_cross_check(const ComponentConfigs& c) {
  if (!c.text_encoders()) return;
  const auto flux = c.parse<models::FluxConfig>("transformer");
  const int64_t clip_hidden = c.parse<models::ClipTextConfig>("text_encoder").hidden_size;
  const int64_t t5_dim = c.parse<models::T5Config>("text_encoder_2").d_model;
  if (clip_hidden != flux.pooled_dim) {
    throw CheckpointError(fmt::format("{}: pooled_projection_dim {} differs from the CLIP hidden_size {} ({})",
                                      c.at("transformer").path, flux.pooled_dim, clip_hidden,
                                      c.at("text_encoder").path),
                          true);
  }
  if (t5_dim != flux.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} differs from the T5 d_model {} ({})",
                                      c.at("transformer").path, flux.joint_dim, t5_dim, c.at("text_encoder_2").path),
                          true);
  }
}

FamilyShapes flux_shapes(const ComponentConfigs& c) {
  const auto f = c.parse<models::FluxConfig>("transformer");
  // The MLP widths; T5's d_model (checked equal to joint_dim); CLIP's pooled embedding.
  return {{f.heads, f.head_dim, 4 * f.inner(), 4 * f.inner(), f.in_channels, f.joint_dim}, f.joint_dim, f.pooled_dim};
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

// The annotations of FluxPipeline.__init__ (pipeline_flux.py): CLIP whole on
// every rank, T5 split only when asked; 28 steps, guidance 3.5.
PipelineSpec flux_spec() {
  return {FluxPipeline::kClass,
          {transformer_component("FluxTransformer2DModel"), vae_component({"AutoencoderKL"}),
           scheduler_component({"FlowMatchEulerDiscreteScheduler"}),
           text_encoder_component("text_encoder", {"CLIPTextModel"}),
           text_encoder_component("text_encoder_2", {"T5EncoderModel"}, TextSplit::kWhenAsked),
           tokenizer_component("tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"}),
           tokenizer_component("tokenizer_2", {"T5TokenizerFast", "T5Tokenizer"}),
           unused_component("image_encoder", "transformers", {"CLIPVisionModelWithProjection"}),
           unused_component("feature_extractor", "transformers", {"CLIPImageProcessor"})},
          CallDefaults{128, 28, 3.5, 1.0, 512}, true, flux_cross_check, flux_shapes, flux_request_options,
          ClipT5Conditioner::tokenize, load_family<FluxPipeline>};
}

}  // namespace

std::unique_ptr<FluxPipeline> FluxPipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                 const PipelineOptions& options) {
  return load_as<FluxPipeline>(folder, tp, options);
}

void FluxPipeline::configure(const ComponentConfigs& configs, const PipelineOptions& options) {
  flux_ = configs.parse<models::FluxConfig>("transformer");
  text_ = std::make_unique<ClipT5Conditioner>(configs.folder(), options.text_encoders, flux_.joint_dim,
                                              flux_.pooled_dim, ctx_.device, ctx_.dtype);
}

// True CFG: true_cfg_scale > 1 and a negative prompt (or its embeddings) given.
bool FluxPipeline::true_cfg(const GenerationRequest& r) const {
  const bool has_neg = r.negative_prompt.has_value() ||
                       (r.has_given("negative_prompt_embeds") && r.has_given("negative_pooled_prompt_embeds"));
  return *r.true_cfg_scale > 1.0 && has_neg;
}

// mu from the image tokens where the scheduler shifts dynamically; sigmas linspace(1, 1/n, n).
std::optional<double> FluxPipeline::schedule_mu(const Scheduler& scheduler, int64_t image_tokens,
                                                int64_t steps) const {
  const FlowMatchEulerDiscreteScheduler& fm = flow_match(scheduler);
  if (!fm.config().use_dynamic_shifting) return std::nullopt;
  return fm.mu_for(image_tokens);
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
