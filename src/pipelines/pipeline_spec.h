#pragma once
// What a pipeline class is made of, declared once by its family and read by
// everything that loads, checks or plans it:
//   check_pipeline_components  model_index.json against the spec, before any
//                              weight byte (component_check.cpp)
//   read_component_configs     the components' configs and the family's
//                              cross-checks (component_configs.h)
//   load_components            every model component on the ranks that hold
//                              it, split where the spec says (component_loader.h)
//   pipeline_layout            the same for the fit planner, from the configs
//                              alone (pipeline_layout.h)
// A family registers its spec, and with it its load, its request options and
// its tokenizer, with one line in its pipeline's .cpp:
//
//   TPRUN_REGISTER_PIPELINE_SPEC(flux_spec);   // PipelineSpec flux_spec()
//
// Each component is the model_index.json entry diffusers' pipeline __init__
// takes: its name, the (library, classes) it accepts, and what tprun does with
// it (its role: the phase it serves, split over the TP group or whole, which
// ranks hold it, the options it is loaded with).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipelines/generation_request.h"
#include "pipelines/pipeline.h"
#include "pipelines/request_checks.h"
#include "pipelines/request_memory.h"

namespace tprun::checkpoint {
struct PipelineFolder;
}

namespace tprun::pipelines {

class ComponentConfigs;

// What a component does in the pipeline.
enum class ComponentRole {
  kTransformer,  // the denoiser: split over the TP group, every rank, denoise phase
  kTextEncoder,  // encode phase, every rank; split where the spec and shard_text_encoders say
  kVae,          // its decoder, decode phase, TP rank 0 (every rank with decode_on_every_rank)
  kTokenizer,    // read by the family's text conditioner
  kScheduler,    // scheduler_config.json, read by the family
  kUnused,       // accepted in model_index.json, never read (FluxPipeline's image_encoder)
};

// The phase a loaded component serves: staged jobs hold the encode phase's
// components and the others at different times.
enum class Phase { Encode, Denoise, Decode };
const char* phase_name(Phase phase);  // "encode" | "denoise" | "decode"

struct ComponentSpec {
  std::string name;               // the model_index.json entry ("text_encoder_2")
  ComponentRole role = ComponentRole::kUnused;
  std::string library;            // "diffusers" | "transformers"
  std::vector<std::string> classes;  // the classes diffusers' __init__ accepts there
  bool required = true;           // a folder without it is refused (naming it)
  // Text encoders: whether this one has a TP plan the pipeline uses, and
  // whether it is split when PipelineOptions::shard_text_encoders is unset.
  bool splittable = false;
  bool split_by_default = false;
  // Text encoders: the hidden states the pipeline reads (ModelOptions::
  // hidden_layers; empty: every layer and the final norm). From the configs.
  std::function<std::vector<int64_t>(const ComponentConfigs&)> hidden_layers;
  // The VAE: held by every rank of the TP group, which split its decode
  // (otherwise TP rank 0 alone, unless decode_on_every_rank).
  bool every_rank = false;
  // A transformer the pipeline loads itself when its stage comes, where
  // PipelineOptions::stage_experts holds one expert at a time (Wan 2.2
  // A14B's transformer_2): not loaded with the others then.
  bool staged_expert = false;

  // Where the component's own class name is written, checked against `classes`:
  // diffusers' config.json / scheduler_config.json "_class_name",
  // transformers' config.json "architectures"[0].
  bool has_model() const;  // transformer, text encoder or VAE
  Phase phase() const;     // a model's phase
};

// What the pipeline's __call__ defaults to.
struct CallDefaults {
  int64_t sample_size = 128;  // default_sample_size: height = width = this x the VAE's scale factor
  int64_t steps = 50;
  std::optional<double> guidance;
  double true_cfg_scale = 1.0;
  int64_t max_sequence_length = 512;
  // A pipeline whose __call__ defaults name pixels and frames (WanPipeline:
  // 480 x 832, 81 frames) instead of a square default_sample_size; 0: unset.
  int64_t height = 0, width = 0, frames = 0;
  // The request with these defaults for a VAE scale factor.
  GenerationRequest request(int64_t vae_scale_factor) const;
};

// The shapes the per-request memory estimate needs, read from the configs.
struct FamilyShapes {
  TransformerShape transformer;
  int64_t text_hidden = 0;  // the width of the text encoder the activation estimate counts
  int64_t pooled_dim = 0;   // a pooled embedding kept per encode (FLUX.1's CLIP); 0: none
};

struct PipelineSpec {
  std::string cls;  // model_index.json's _class_name
  std::vector<ComponentSpec> components;
  CallDefaults defaults;
  // Latent layout: 2x2 latent patches packed into the channels, so the
  // transformer's in_channels must be 4 x the VAE's latent channels (checked
  // with the configs, naming both files).
  bool packs_2x2 = true;
  // Checks between the components' configs (CheckpointError naming both
  // files), run on every load and layout before any weight byte is read. The
  // configs of the text encoders are there only when they are loaded.
  std::function<void(const ComponentConfigs&)> cross_check;
  std::function<FamilyShapes(const ComponentConfigs&)> shapes;
  // What its requests may set, from the folder's configs (request_checks.h).
  RequestOptionsReader request_options;
  // The ids its tokenizers give a prompt (`tprun tokenize`), no weight read.
  PromptTokenizer tokenize;
  // The family's load (DiffusionPipeline::begin_load / finish_load).
  PipelineLoader load;

  const ComponentSpec* find(const std::string& name) const;
  // The model components in load order: transformer, text encoders (in spec order), VAE.
  std::vector<const ComponentSpec*> models_in_load_order() const;
};

// Component specs by role, for the families' spec functions.
ComponentSpec transformer_component(const std::string& cls);
ComponentSpec vae_component(const std::vector<std::string>& classes);
ComponentSpec scheduler_component(const std::vector<std::string>& classes);
// A text encoder: never split, split when shard_text_encoders asks, or split
// unless shard_text_encoders = false; `hidden_layers` as ComponentSpec's.
enum class TextSplit { kNever, kWhenAsked, kByDefault };
ComponentSpec text_encoder_component(
    const std::string& name, const std::vector<std::string>& classes, TextSplit split = TextSplit::kNever,
    std::function<std::vector<int64_t>(const ComponentConfigs&)> hidden_layers = {});
ComponentSpec tokenizer_component(const std::string& name, const std::vector<std::string>& classes);
ComponentSpec unused_component(const std::string& name, const std::string& library,
                               const std::vector<std::string>& classes);

// `folder`'s model_index.json, for a class with a registered spec. ConfigError
// naming the folder for one that is not a pipeline folder, or naming the
// class and the known ones.
checkpoint::PipelineFolder open_registered_folder(const std::string& folder);

using PipelineSpecFn = std::function<PipelineSpec()>;
// The spec of a registered pipeline class, or nullptr.
const PipelineSpec* find_pipeline_spec(const std::string& cls);
std::vector<std::string> pipeline_spec_names();

namespace detail {
bool register_pipeline_spec(const PipelineSpecFn& fn);
}

}  // namespace tprun::pipelines

#define TPRUN_SPEC_CONCAT_(a, b) a##b
#define TPRUN_SPEC_CONCAT(a, b) TPRUN_SPEC_CONCAT_(a, b)
// In the family's pipeline .cpp: TPRUN_REGISTER_PIPELINE_SPEC(flux_spec);
#define TPRUN_REGISTER_PIPELINE_SPEC(fn)                                                           \
  static const bool TPRUN_SPEC_CONCAT(tprun_pipeline_spec_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::pipelines::detail::register_pipeline_spec(fn)
