#pragma once
// What a pipeline family loads where, read from a folder's configs alone (no
// weight byte, no tokenizer): each component with the phase it serves, the
// options its table is built and loaded with, whether it is split over the
// TP group and which ranks hold it; and the shapes the per-request memory
// estimate (request_memory.h) needs. The fit planner (fit_planner.h) and
// `tprun inspect` read it. A family registers its reader in its own file,
// next to its pipeline:
//
//   TPRUN_REGISTER_PIPELINE_LAYOUT("FluxPipeline", flux_layout);
//
// A layout mirrors its family's load (which components, which options, which
// TP group); the fit planner's tests compare it with real loads.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/model.h"
#include "pipelines/generation_request.h"
#include "pipelines/pipeline.h"
#include "pipelines/request_memory.h"

namespace tprun::checkpoint {
struct PipelineFolder;
}

namespace tprun::pipelines {

// The phase a component serves: staged jobs hold the encode phase's
// components and the others at different times.
enum class Phase { Encode, Denoise, Decode };
const char* phase_name(Phase phase);  // "encode" | "denoise" | "decode"

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
  // The pipeline's __call__ defaults for what sizes a request: height,
  // width, max_sequence_length.
  GenerationRequest defaults;

  const ComponentLayout* find(const std::string& component) const;
  // Image tokens of a height x width request (packed 2x2 latents).
  int64_t image_tokens(int64_t height, int64_t width) const;
};

// Reads `folder`'s configs for `pf.cls`'s family (after
// check_pipeline_components). Checked like the family's load: CheckpointError
// naming the file and field for configs that do not fit together.
using LayoutReader = std::function<PipelineLayout(const checkpoint::PipelineFolder& folder,
                                                  const PipelineOptions& options)>;

// The layout of the pipeline `folder`'s model_index.json names, for a load
// with `options`. ConfigError as load_pipeline gives for a folder that is not
// a pipeline or a class tprun cannot run; the components checked as
// load_pipeline checks them.
PipelineLayout pipeline_layout(const std::string& folder, const PipelineOptions& options);
// Whether a layout is registered for the class `cls`.
bool has_pipeline_layout(const std::string& cls);

// Steps the families' layouts share.
// Component `name` of `pf` (CheckpointError as need_component when absent)
// serving `phase`, with component_options(options, name); whole on every rank.
ComponentLayout component_layout(const checkpoint::PipelineFolder& pf, const std::string& name, Phase phase,
                                 const PipelineOptions& options);
// The VAE's decoder as load_vae_decoder loads it (TP rank 0 alone unless
// decode_on_every_rank; fp32 where force_upcast lifts a 16-bit dtype), added
// to `layout` with its shape (layout.vae, vae_scale_factor) and its tiles
// checked as the families' loads check them. Returns its config's path and class.
struct VaeConfigRead {
  std::string path, cls;
};
VaeConfigRead add_vae_decoder(const checkpoint::PipelineFolder& pf, const PipelineOptions& options,
                              PipelineLayout& layout);

namespace detail {
bool register_pipeline_layout(const char* cls, LayoutReader reader);
}

}  // namespace tprun::pipelines

// In the family's layout .cpp: TPRUN_REGISTER_PIPELINE_LAYOUT("FluxPipeline", flux_layout);
#define TPRUN_REGISTER_PIPELINE_LAYOUT(name, fn)                                                   \
  static const bool TPRUN_PIPELINE_CONCAT(tprun_layout_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::pipelines::detail::register_pipeline_layout(name, fn)
