// Flux2Pipeline / Flux2KleinPipeline's layout (pipeline_layout.h): what
// Flux2Pipeline::load (flux2_pipeline.cpp) loads where, from the configs alone.
//   transformer   denoise, over the TP group (shard_modulation as asked)
//   text_encoder  encode, over the TP group unless shard_text_encoders = false;
//                 only the layers up to the last hidden state the pipeline
//                 stacks are loaded (ModelOptions::hidden_layers)
//   vae           decode, the decoder on TP rank 0 (every rank with decode_on_every_rank)
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "models/decoder_text_encoder.h"
#include "models/flux2_transformer.h"
#include "models/model_config.h"
#include "pipelines/family_steps.h"
#include "pipelines/flux2_defaults.h"
#include "pipelines/flux2_pipeline.h"
#include "pipelines/pipeline_layout.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

// The text encoder against the transformer and the stacked layers, as the
// pipeline's load checks them (its tokenizer is not read here).
void add_text_encoder(const checkpoint::PipelineFolder& pf, const PipelineOptions& options, bool klein,
                      const models::Flux2Config& flux2, const std::string& transformer_path, PipelineLayout& l) {
  ComponentLayout te = component_layout(pf, "text_encoder", Phase::Encode, options);
  std::string path;
  const auto cfg = models::DecoderConfig::from_json(models::read_component_config(te.path, &path), path);
  const std::vector<int64_t> layers = flux2_stacked_layers(klein);
  if (3 * cfg.hidden_size != flux2.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not 3 x the text encoder's hidden_size {} ({})",
                                      transformer_path, flux2.joint_dim, cfg.hidden_size, path),
                          true);
  }
  if (cfg.layers < layers.back()) {
    throw CheckpointError(fmt::format("{}: the text encoder has {} layers; the {} stacks hidden states {}, {}, {}",
                                      path, cfg.layers, pf.cls, layers[0], layers[1], layers[2]),
                          true);
  }
  te.options.hidden_layers = layers;
  te.sharded = options.shard_text_encoders.value_or(true);
  l.text_hidden = cfg.hidden_size;
  l.components.push_back(std::move(te));
}

PipelineLayout flux2_layout(const checkpoint::PipelineFolder& pf, const PipelineOptions& options) {
  PipelineLayout l;
  l.cls = pf.cls;
  const bool klein = pf.cls == Flux2Pipeline::kKleinClass;
  ComponentLayout transformer = component_layout(pf, "transformer", Phase::Denoise, options);
  std::string transformer_path;
  const auto flux2 = models::Flux2Config::from_json(models::read_component_config(transformer.path, &transformer_path),
                                                    transformer_path);
  if (!klein && !flux2.guidance) {
    throw CheckpointError(
        fmt::format("{}: a Flux2Pipeline (dev) transformer needs guidance_embeds", transformer_path), true);
  }
  transformer.options.shard_modulation = options.shard_modulation;
  transformer.class_skip = models::Flux2Transformer::class_skip_patterns();
  transformer.sharded = true;
  if (options.denoiser) l.components.push_back(std::move(transformer));
  l.transformer = {flux2.heads,       flux2.head_dim,    2 * flux2.mlp_hidden(),
                   flux2.mlp_hidden(), flux2.in_channels, flux2.joint_dim};
  if (options.text_encoders) add_text_encoder(pf, options, klein, flux2, transformer_path, l);
  const VaeConfigRead vae = add_vae_decoder(pf, options, l);
  if (vae.cls != "AutoencoderKLFlux2") {
    throw CheckpointError(fmt::format("{}: a {} needs an AutoencoderKLFlux2 VAE, not {}", vae.path, pf.cls, vae.cls),
                          true);
  }
  check_packed_channels(flux2.in_channels, transformer_path, l.vae.latent_channels, vae.path);
  l.defaults = flux2_defaults(l.vae_scale_factor);
  return l;
}

}  // namespace

TPRUN_REGISTER_PIPELINE_LAYOUT(Flux2Pipeline::kClass, flux2_layout);
TPRUN_REGISTER_PIPELINE_LAYOUT(Flux2Pipeline::kKleinClass, flux2_layout);

}  // namespace tprun::pipelines
