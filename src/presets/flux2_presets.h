#pragma once
// Preset FLUX.2 pipelines with random weights (`tprun init-model --arch
// flux2-klein | flux2-dev`): complete diffusers folders that
// Flux2KleinPipeline / Flux2Pipeline.from_pretrained load unchanged, offline:
//   transformer/   Flux2Transformer2DModel (klein: no guidance embedder; dev: with it)
//   vae/           AutoencoderKLFlux2 (latent batch-norm statistics included)
//   text_encoder/  Qwen3ForCausalLM (klein) / Mistral3ForConditionalGeneration
//                  with a small Pixtral vision tower (dev), enough layers for
//                  the hidden states the pipeline stacks (27 / 30)
//   tokenizer/     a byte-level BPE learned from the bundled corpus with the
//                  Qwen3 chat template (klein) or a Pixtral processor folder
//                  with the Mistral template (dev) (hf_tokenizer_files.h)
//   scheduler/     FlowMatchEulerDiscreteScheduler (dynamic exponential shift)
//   model_index.json  (klein: is_distilled false)
// The sizes fit together: in_channels = 4 x latent_channels, joint_attention_dim
// = 3 x the text encoder's hidden size, the text vocabulary covers the tokenizer.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "presets/pipeline_preset.h"

namespace tprun::presets {

struct Flux2Preset {
  std::string name;
  bool klein = true;
  // Flux2Transformer2DModel
  int64_t num_layers = 1, num_single_layers = 1, num_attention_heads = 2, attention_head_dim = 32;
  std::vector<int64_t> axes_dims_rope = {8, 8, 8, 8};
  // AutoencoderKLFlux2 (latent_channels; vae scale factor 2^(levels-1))
  int64_t latent_channels = 8;
  std::vector<int64_t> vae_block_out_channels = {8, 16, 16, 16};
  int64_t vae_layers_per_block = 1, vae_norm_num_groups = 4;
  // The text encoder (hidden = joint_attention_dim / 3)
  int64_t text_hidden = 32, text_intermediate = 64, text_heads = 4, text_kv_heads = 2, text_head_dim = 8;
  int64_t text_layers = 28;  // klein stacks hidden_states 9, 18, 27; dev 10, 20, 30 (then 31)
  // The tokenizer's BPE merges.
  int64_t merges = 1500;
};

// "tiny" (a 64x64 image in well under a second) or "small" (benchmarks), for
// arch "flux2-klein" or "flux2-dev". ConfigError naming the known ones otherwise.
Flux2Preset flux2_preset(const std::string& arch, const std::string& name);
std::vector<std::string> flux2_preset_names();

// The folder of `preset` for a tokenizer of `text_vocab_size` ids. Components:
// transformer, vae, text_encoder; tokenizer: tokenizer.
PipelinePreset flux2_pipeline_preset(const Flux2Preset& preset, int64_t text_vocab_size);

// Writes the whole folder atomically (as write_flux_pipeline does).
InitModelSummary write_flux2_pipeline(const std::string& dir, const Flux2Preset& preset, uint64_t seed, bool force);

}  // namespace tprun::presets
