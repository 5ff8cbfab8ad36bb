// FluxPipeline's layout (pipeline_layout.h): what FluxPipeline::load
// (flux_pipeline.cpp) loads where, from the configs alone.
//   transformer     denoise, over the TP group (shard_modulation as asked)
//   text_encoder    encode, CLIP whole on every rank
//   text_encoder_2  encode, T5 whole on every rank unless shard_text_encoders
//   vae             decode, the decoder on TP rank 0 (every rank with decode_on_every_rank)
// Neither text encoder has a hidden-layer cut.
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "models/clip_text_model.h"
#include "models/flux_transformer.h"
#include "models/model_config.h"
#include "models/t5_encoder.h"
#include "pipelines/family_steps.h"
#include "pipelines/flux_defaults.h"
#include "pipelines/pipeline_layout.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

// CLIP and T5 against the transformer, as the pipeline's load checks them; T5's width.
int64_t add_text_encoders(const checkpoint::PipelineFolder& pf, const PipelineOptions& options,
                          const models::FluxConfig& flux, const std::string& transformer_path, PipelineLayout& l) {
  ComponentLayout clip = component_layout(pf, "text_encoder", Phase::Encode, options);
  ComponentLayout t5 = component_layout(pf, "text_encoder_2", Phase::Encode, options);
  std::string clip_path, t5_path;
  const auto clip_cfg = models::ClipTextConfig::from_json(models::read_component_config(clip.path, &clip_path), clip_path);
  const auto t5_cfg = models::T5Config::from_json(models::read_component_config(t5.path, &t5_path), t5_path);
  if (clip_cfg.hidden_size != flux.pooled_dim) {
    throw CheckpointError(fmt::format("{}: pooled_projection_dim {} differs from the CLIP hidden_size {} ({})",
                                      transformer_path, flux.pooled_dim, clip_cfg.hidden_size, clip_path),
                          true);
  }
  if (t5_cfg.d_model != flux.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} differs from the T5 d_model {} ({})",
                                      transformer_path, flux.joint_dim, t5_cfg.d_model, t5_path),
                          true);
  }
  t5.sharded = options.shard_text_encoders.value_or(false);
  t5.class_skip = models::T5Encoder::class_skip_patterns();
  l.components.push_back(std::move(clip));
  l.components.push_back(std::move(t5));
  return t5_cfg.d_model;
}

PipelineLayout flux_layout(const checkpoint::PipelineFolder& pf, const PipelineOptions& options) {
  PipelineLayout l;
  l.cls = pf.cls;
  ComponentLayout transformer = component_layout(pf, "transformer", Phase::Denoise, options);
  std::string transformer_path;
  const auto flux =
      models::FluxConfig::from_json(models::read_component_config(transformer.path, &transformer_path), transformer_path);
  transformer.options.shard_modulation = options.shard_modulation;
  transformer.class_skip = models::FluxTransformer::class_skip_patterns();
  transformer.sharded = true;
  if (options.denoiser) l.components.push_back(std::move(transformer));
  l.transformer = {flux.heads, flux.head_dim, 4 * flux.inner(), 4 * flux.inner(), flux.in_channels, flux.joint_dim};
  l.pooled_dim = flux.pooled_dim;
  if (options.text_encoders) l.text_hidden = add_text_encoders(pf, options, flux, transformer_path, l);
  const VaeConfigRead vae = add_vae_decoder(pf, options, l);
  check_packed_channels(flux.in_channels, transformer_path, l.vae.latent_channels, vae.path);
  l.defaults = flux_defaults(l.vae_scale_factor);
  return l;
}

}  // namespace

TPRUN_REGISTER_PIPELINE_LAYOUT("FluxPipeline", flux_layout);

}  // namespace tprun::pipelines
