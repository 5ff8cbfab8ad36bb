#pragma once
// Preset Qwen-Image pipelines with random weights (`tprun init-model --arch
// qwen-image`): complete diffusers folders laid out as the hub ships
// Qwen/Qwen-Image, which QwenImagePipeline.from_pretrained loads offline:
//   transformer/   QwenImageTransformer2DModel (no guidance embedder)
//   vae/           AutoencoderKLQwenImage (latents_mean / latents_std included)
//   text_encoder/  Qwen2_5_VLForConditionalGeneration, config in the hub's flat
//                  (transformers 4.x) layout with rope_scaling mrope; the
//                  language model's weights only (the vision tower is never
//                  run by the pipeline; transformers draws it at load)
//   tokenizer/     a byte-level BPE learned from the bundled corpus in the
//                  slow layout the hub ships (vocab.json, merges.txt,
//                  tokenizer_config.json with Qwen2.5-VL's added tokens; no
//                  tokenizer.json)
//   scheduler/     FlowMatchEulerDiscreteScheduler as Qwen-Image's
//                  (shift_terminal 0.02, exponential dynamic shift up to 8192 tokens)
//   model_index.json
// The sizes fit together: in_channels = 4 x z_dim, joint_attention_dim = the
// text encoder's hidden size, the text vocabulary covers the tokenizer.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "presets/pipeline_preset.h"

namespace tprun::presets {

struct QwenImagePreset {
  std::string name;
  // QwenImageTransformer2DModel
  int64_t num_layers = 2, num_attention_heads = 2, attention_head_dim = 32;
  std::vector<int64_t> axes_dims_rope = {8, 12, 12};
  // AutoencoderKLQwenImage (scale factor 2^len(temperal_downsample) = 8)
  int64_t z_dim = 4, vae_base_dim = 8, vae_res_blocks = 1;
  std::vector<int64_t> vae_dim_mult = {1, 2, 2, 2};
  // Qwen2.5-VL language model (hidden = joint_attention_dim)
  int64_t text_hidden = 32, text_intermediate = 64, text_heads = 4, text_kv_heads = 2, text_layers = 2;
  std::vector<int64_t> mrope_section = {1, 1, 2};  // sums to head_dim / 2
  int64_t merges = 1500;
};

// "tiny" (a 64x64 image in well under a second) or "small" (benchmarks).
// ConfigError naming the known ones otherwise.
QwenImagePreset qwen_image_preset(const std::string& name);
std::vector<std::string> qwen_image_preset_names();

// The folder of `preset` for a tokenizer of `text_vocab_size` ids. Components:
// transformer, vae, text_encoder; tokenizer: tokenizer.
PipelinePreset qwen_image_pipeline_preset(const QwenImagePreset& preset, int64_t text_vocab_size);

// Writes the whole folder atomically (as write_flux_pipeline does).
InitModelSummary write_qwen_image_pipeline(const std::string& dir, const QwenImagePreset& preset, uint64_t seed,
                                           bool force);

}  // namespace tprun::presets
