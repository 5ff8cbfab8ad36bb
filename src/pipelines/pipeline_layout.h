#pragma once
// What a pipeline loads where, read from a folder's configs alone (no
// weight byte, no tokenizer): each component with the phase it serves, the
// options its table is built and loaded with, whether it is split over the
// TP group and which ranks hold it; and the shapes the per-request memory
// estimate (request_memory.h) needs. The fit planner (fit_planner.h) and
// `tprun inspect` read it. It is derived from the family's spec
// (pipeline_spec.h) by the same functions the load uses (component_configs.h,
// component_loader.h), so the two cannot drift apart; the fit planner's
// tests compare it with real loads.

#include <cstdint>
#include <string>
#include <vector>

#include "models/model.h"
#include "pipelines/generation_request.h"
#include "pipelines/pipeline.h"
#include "pipelines/pipeline_spec.h"
#include "pipelines/request_memory.h"

namespace tprun::checkpoint {
struct PipelineFolder;
}

namespace tprun::pipelines {

struct ComponentLayout {
  std::string name;  // the model_index.json component ("text_encoder_2")
  std::string path;  // its folder
  Phase phase = Phase::Denoise;
  // The options the family loads it with (component_options plus its own:
  // hidden_layers, part, shard_modulation); `dtype` is the dtype it computes
  // in (the VAE's fp32 when force_upcast lifts a 16-bit one). Its table built
  // with them marks what the load never reads as optional.
  models::ModelOptions options;
  // The layerwise-casting patterns its class adds (class_skip_patterns()).
  std::vector<std::string> class_skip;
  bool sharded = false;          // split over the TP group; else whole on each rank that holds it
  bool rank_zero_only = false;   // held by TP rank 0 alone (the VAE's decoder by default)
  bool holds(int tp_rank) const { return !rank_zero_only || tp_rank == 0; }
};

struct PipelineLayout {
  std::string cls;  // model_index.json's _class_name
  std::vector<ComponentLayout> components;  // in load order
  TransformerShape transformer;
  int64_t text_hidden = 0;     // the width of the text encoder the activation estimate counts
  int64_t pooled_dim = 0;      // a pooled embedding kept per encode (FLUX.1's CLIP); 0: none
  VaeShape vae;                // decoder channels, scale factor, dtype bytes, tiling (backend: the planner's)
  int64_t vae_scale_factor = 8;
  int64_t temporal_scale = 1;  // frames per latent frame after the first (a video VAE's; 1: images)
  // The pipeline's __call__ defaults for what sizes a request: height,
  // width, max_sequence_length.
  GenerationRequest defaults;

  const ComponentLayout* find(const std::string& component) const;
  // Image tokens of a height x width request (packed 2x2 latents).
  int64_t image_tokens(int64_t height, int64_t width) const;
  // The same over every latent frame of a `frames`-frame result.
  int64_t latent_tokens(int64_t height, int64_t width, int64_t frames) const;
};

// The layout of the pipeline `folder`'s model_index.json names, for a load
// with `options`. ConfigError as load_pipeline gives for a folder that is not
// a pipeline or a class tprun cannot run; the components checked as
// load_pipeline checks them.
PipelineLayout pipeline_layout(const std::string& folder, const PipelineOptions& options);

}  // namespace tprun::pipelines
