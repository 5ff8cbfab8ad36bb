#pragma once
// Preset Wan text-to-video pipelines with random weights (`tprun init-model
// --arch wan | wan-a14b`): complete diffusers folders laid out as
// WanPipeline.save_pretrained (diffusers 0.40) writes Wan-AI/Wan2.1-T2V-1.3B-
// Diffusers and Wan2.2-T2V-A14B-Diffusers, which WanPipeline.from_pretrained
// loads offline:
//   transformer/    WanTransformer3DModel (patch [1, 2, 2], qk_norm
//                   rms_norm_across_heads, cross_attn_norm, no I2V parts)
//   transformer_2/  wan-a14b only: the low-noise expert, the same config
//   vae/            AutoencoderKLWan (z_dim 16, 4x temporal / 8x spatial,
//                   the hub's latents_mean / latents_std)
//   text_encoder/   UMT5EncoderModel, config.json as transformers 5.17 writes it
//   tokenizer/      a SentencePiece unigram learned from the bundled corpus
//   scheduler/      UniPCMultistepScheduler (flow_prediction, use_flow_sigmas,
//                   flow_shift 3.0, order 2, bh2)
//   model_index.json  WanPipeline with boundary_ratio (null; wan-a14b: 0.875),
//                   expand_timesteps false and transformer_2 ([null, null] for wan)
// The sizes fit together: in_channels = out_channels = z_dim, text_dim = the
// UMT5 d_model, the UMT5 vocabulary covers the tokenizer, and head_dim splits
// for the 3-D RoPE (time head_dim - 4*(head_dim/6), height and width
// 2*(head_dim/6) each, all even and positive).

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "presets/pipeline_preset.h"

namespace tprun::presets {

struct WanPreset {
  std::string name;
  bool two_experts = false;  // wan-a14b: transformer + transformer_2, boundary_ratio 0.875
  // WanTransformer3DModel (dim = heads x head_dim; 4 heads: tp 1, 2 and 4 divide them)
  int64_t num_layers = 2, num_attention_heads = 4, attention_head_dim = 12, ffn_dim = 96;
  // UMT5EncoderModel (d_model = the transformer's text_dim)
  int64_t text_d_model = 32, text_d_kv = 8, text_heads = 4, text_d_ff = 64, text_layers = 2;
  // AutoencoderKLWan (z_dim 16: the transformer's in/out channels)
  int64_t vae_base_dim = 8, vae_res_blocks = 1;
  std::vector<int64_t> vae_dim_mult = {1, 2, 2, 2};
  // The tokenizer's SentencePiece pieces (at most).
  int text_pieces = 500;
};

// "tiny" (a few 64x64 frames in well under a second a step on one core) or
// "small" (benchmarks), for arch "wan" (Wan 2.1) or "wan-a14b" (Wan 2.2 A14B,
// two experts). ConfigError naming the known ones otherwise.
WanPreset wan_preset(const std::string& arch, const std::string& name);
std::vector<std::string> wan_preset_names();

// The folder of `preset` for a tokenizer of `tokenizer_length` ids (pieces +
// extra ids; the UMT5 vocab_size rounds it up to a multiple of 128, as
// umt5-xxl's 256,384 rows). Components: transformer, [transformer_2,] vae,
// text_encoder; tokenizer: tokenizer. ConfigError when the sizes do not fit.
PipelinePreset wan_pipeline_preset(const WanPreset& preset, int64_t tokenizer_length);

// ConfigError naming the file and field where the components do not fit
// together (see the top of this file) or a size is not positive.
void check_wan_pipeline_preset(const PipelinePreset& preset, int64_t tokenizer_length);

// Writes the whole folder atomically (as write_flux_pipeline does).
InitModelSummary write_wan_pipeline(const std::string& dir, const WanPreset& preset, uint64_t seed, bool force);

}  // namespace tprun::presets
