// QwenImagePipeline's layout (pipeline_layout.h): what QwenImagePipeline::load
// (qwen_image_pipeline.cpp) loads where, from the configs alone.
//   transformer   denoise, over the TP group (shard_modulation as asked)
//   text_encoder  encode, the Qwen2.5-VL language model over the TP group
//                 unless shard_text_encoders = false; every layer and the
//                 final norm (the pipeline takes the last hidden state), never
//                 the vision tower or lm_head
//   vae           decode, the decoder on TP rank 0 (every rank with
//                 decode_on_every_rank), in the pipeline's dtype
#include "pipelines/qwen_image_layout.h"

#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/decoder_text_encoder.h"
#include "models/model_config.h"
#include "models/nn_ops.h"
#include "models/qwen_image_transformer.h"
#include "models/qwen_image_vae.h"
#include "pipelines/family_steps.h"
#include "pipelines/pipeline_layout.h"
#include "pipelines/qwen_image_defaults.h"
#include "runtime/error.h"

namespace tprun::pipelines {

VaeShape qwen_image_vae_shape(const models::QwenImageVaeConfig& config, const std::string& dtype,
                              const std::string& device, bool tiling, int64_t tile_sample) {
  VaeShape s;
  for (auto it = config.dim_mult.rbegin(); it != config.dim_mult.rend(); ++it) {
    s.decoder_channels.push_back(config.base_dim * *it);
  }
  s.latent_channels = config.z_dim;
  s.scale_factor = config.scale_factor();
  const c10::ScalarType st = checkpoint::parse_compute_dtype(dtype, "vae dtype");
  s.elem_bytes = static_cast<int64_t>(c10::elementSize(st));
  const int64_t widest = s.decoder_channels.empty() ? 64 : s.decoder_channels.front();
  s.scores_materialised = models::nn::sdpa_backend(device, st, 1, widest, false).find("math") != std::string::npos;
  s.tiling = tiling;
  s.tile_sample = tile_sample > 0 ? tile_sample : 256;
  return s;
}

namespace {

PipelineLayout qwen_image_layout(const checkpoint::PipelineFolder& pf, const PipelineOptions& options) {
  PipelineLayout l;
  l.cls = pf.cls;
  ComponentLayout transformer = component_layout(pf, "transformer", Phase::Denoise, options);
  std::string transformer_path;
  const auto qwen = models::QwenImageConfig::from_json(
      models::read_component_config(transformer.path, &transformer_path), transformer_path);
  transformer.options.shard_modulation = options.shard_modulation;
  transformer.class_skip = models::QwenImageTransformer::class_skip_patterns();
  transformer.sharded = true;
  if (options.denoiser) l.components.push_back(std::move(transformer));
  l.transformer = {qwen.heads, qwen.head_dim, qwen.mlp_hidden(), qwen.mlp_hidden(), qwen.in_channels, qwen.joint_dim};

  if (options.text_encoders) {
    ComponentLayout te = component_layout(pf, "text_encoder", Phase::Encode, options);
    std::string path;
    const auto cfg = models::DecoderConfig::from_json(models::read_component_config(te.path, &path), path);
    if (cfg.hidden_size != qwen.joint_dim) {
      throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not the text encoder's hidden_size {} ({})",
                                        transformer_path, qwen.joint_dim, cfg.hidden_size, path),
                            true);
    }
    te.options.hidden_layers = {cfg.layers};
    te.sharded = options.shard_text_encoders.value_or(true);
    l.text_hidden = cfg.hidden_size;
    l.components.push_back(std::move(te));
  }

  ComponentLayout vae = component_layout(pf, "vae", Phase::Decode, options);
  std::string vae_path;
  const auto v = models::QwenImageVaeConfig::from_json(models::read_component_config(vae.path, &vae_path), vae_path);
  check_packed_channels(qwen.in_channels, transformer_path, v.z_dim, vae_path);
  vae.options.part = "decoder";
  vae.rank_zero_only = !options.decode_on_every_rank;
  const auto& mem = options.component_base.memory;
  l.vae = qwen_image_vae_shape(v, options.dtype, options.device, mem.vae_tiling, mem.vae_tile_sample_size);
  l.vae_scale_factor = v.scale_factor();
  if (options.denoiser) l.components.push_back(std::move(vae));
  l.defaults = qwen_image_defaults(l.vae_scale_factor);
  return l;
}

}  // namespace

TPRUN_REGISTER_PIPELINE_LAYOUT(kQwenImagePipelineClass, qwen_image_layout);

}  // namespace tprun::pipelines
