#pragma once
// Preset FLUX.1 pipelines with random weights (`tprun init-model`): the sizes
// of each preset, the config.json of every component as diffusers /
// transformers write them, and the writer of a complete diffusers-layout
// pipeline folder (configs, random weights from init_weights.h, tokenizers
// learned by presets/tokenizer_files.h from the bundled corpus) that
// FluxPipeline.from_pretrained loads unchanged.
//
// The sizes fit together: transformer in_channels = 4 * vae latent_channels,
// pooled_projection_dim = CLIP hidden_size, joint_attention_dim = T5 d_model,
// CLIP vocab_size = the BPE vocabulary, T5 vocab_size >= the tokenizer's
// length (pieces + extra ids), sum(axes_dims_rope) = attention_head_dim.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "presets/pipeline_preset.h"

namespace tprun::presets {

struct FluxPreset {
  std::string name;
  // FluxTransformer2DModel
  int64_t num_layers = 1, num_single_layers = 1, num_attention_heads = 2, attention_head_dim = 16;
  std::vector<int64_t> axes_dims_rope = {4, 6, 6};
  // CLIPTextModel (hidden = the transformer's pooled_projection_dim)
  int64_t clip_hidden = 32, clip_intermediate = 64, clip_layers = 2, clip_heads = 4;
  // T5EncoderModel (d_model = the transformer's joint_attention_dim)
  int64_t t5_d_model = 32, t5_layers = 2, t5_heads = 4, t5_d_kv = 8, t5_d_ff = 64;
  // AutoencoderKL (latent_channels 16, vae scale factor 2^(levels-1))
  std::vector<int64_t> vae_block_out_channels = {8, 16, 16, 16};
  int64_t vae_layers_per_block = 1, vae_norm_num_groups = 4, vae_sample_size = 64;
  // Tokenizers: BPE merges to learn, SentencePiece pieces (at most).
  int64_t clip_merges = 1000;
  int t5_pieces = 500;
};

// "tiny" (a 64x64 image in well under a second on one core) or "small" (the
// benchmark size). ConfigError naming the known presets otherwise.
FluxPreset flux_preset(const std::string& name);
std::vector<std::string> flux_preset_names();

// The folder of `preset` for tokenizers of these sizes: the CLIP vocabulary
// and the T5 tokenizer's length (T5 vocab_size rounds it up to a multiple of
// 64, as T5's 32128 rows hold 32100 tokens). Components: transformer, vae,
// text_encoder (CLIP), text_encoder_2 (T5); tokenizers: tokenizer, tokenizer_2.
PipelinePreset flux_pipeline_preset(const FluxPreset& preset, int64_t clip_vocab_size, int64_t t5_tokenizer_length);

// ConfigError naming both fields when the components do not fit together (see
// the top of this file) or a size is not positive / not divisible.
void check_flux_pipeline_preset(const PipelinePreset& preset, int64_t clip_vocab_size, int64_t t5_tokenizer_length);

// Writes the whole pipeline folder to `dir`, atomically: it is built in
// `dir`.tmp-<pid> and renamed into place (removed again on failure). An
// existing non-empty `dir` is refused with a ConfigError naming it unless
// `force` (then it is replaced); an existing file that is not a folder is
// always refused. The same preset and seed give the same bytes anywhere.
InitModelSummary write_flux_pipeline(const std::string& dir, const FluxPreset& preset, uint64_t seed, bool force);

}  // namespace tprun::presets
