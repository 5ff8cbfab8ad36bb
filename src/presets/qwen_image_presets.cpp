#include "presets/qwen_image_presets.h"

#include <filesystem>

#include <fmt/format.h>

#include "presets/decoder_lm_config.h"
#include "presets/hf_tokenizer_files.h"
#include "presets/preset_registry.h"
#include "presets/qwen_image_tokenizer_files.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The hub's flat layout (as transformers 4.5x saved Qwen2.5-VL-7B-Instruct):
// the language model's keys at the top, rope_scaling with the mrope sections,
// a small vision tower config (never run by the pipeline).
json qwen2_5_vl_config(const QwenImagePreset& p, int64_t vocab) {
  const json vision = {{"depth", 1},
                       {"fullatt_block_indexes", json::array({0})},
                       {"hidden_act", "silu"},
                       {"hidden_size", 16},
                       {"in_chans", 3},
                       {"intermediate_size", 32},
                       {"model_type", "qwen2_5_vl"},
                       {"num_heads", 2},
                       {"out_hidden_size", p.text_hidden},
                       {"patch_size", 14},
                       {"spatial_merge_size", 2},
                       {"spatial_patch_size", 14},
                       {"temporal_patch_size", 2},
                       {"tokens_per_second", 2},
                       {"window_size", 112}};
  const DecoderLm lm = {"qwen2_5_vl", p.text_hidden, p.text_intermediate, p.text_heads, p.text_kv_heads,
                        p.text_layers, vocab, 128000, 1e-06};
  return decoder_lm_config(
      lm, {{"architectures", json::array({"Qwen2_5_VLForConditionalGeneration"})},
           {"max_window_layers", p.text_layers},
           {"rope_scaling", {{"mrope_section", p.mrope_section}, {"rope_type", "default"}, {"type", "mrope"}}},
           {"rope_theta", 1000000.0},
           {"sliding_window", 32768},
           {"torch_dtype", "float32"},
           {"transformers_version", "4.53.1"},
           {"use_sliding_window", false},
           {"vision_config", vision}});
}

std::vector<double> latent_statistics(int64_t n, double first, double step) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(first + step * static_cast<double>(i));
  return v;
}

json transformer_config(const QwenImagePreset& p) {
  return diffusers_config("QwenImageTransformer2DModel",
                          {{"attention_head_dim", p.attention_head_dim},
                           {"axes_dims_rope", p.axes_dims_rope},
                           {"guidance_embeds", false},
                           {"in_channels", 4 * p.z_dim},
                           {"joint_attention_dim", p.text_hidden},
                           {"num_attention_heads", p.num_attention_heads},
                           {"num_layers", p.num_layers},
                           {"out_channels", p.z_dim},
                           {"patch_size", 2},
                           {"pooled_projection_dim", 768}});
}

json vae_config(const QwenImagePreset& p) {
  return diffusers_config("AutoencoderKLQwenImage",
                          {{"attn_scales", json::array()},
                           {"base_dim", p.vae_base_dim},
                           {"dim_mult", p.vae_dim_mult},
                           {"dropout", 0.0},
                           {"latents_mean", latent_statistics(p.z_dim, -0.3, 0.05)},
                           {"latents_std", latent_statistics(p.z_dim, 1.5, 0.25)},
                           {"num_res_blocks", p.vae_res_blocks},
                           {"temperal_downsample", {false, true, true}},
                           {"z_dim", p.z_dim}});
}

}  // namespace

std::vector<std::string> qwen_image_preset_names() { return preset_names(); }

QwenImagePreset qwen_image_preset(const std::string& name) {
  return sized_preset(name, QwenImagePreset{}, [](QwenImagePreset& p) {  // "small": one line a component
    p.num_layers = 4, p.num_attention_heads = 4, p.attention_head_dim = 64;
    p.axes_dims_rope = {16, 24, 24};
    p.z_dim = 16, p.vae_base_dim = 32;
    p.text_hidden = 128, p.text_intermediate = 384, p.text_heads = 8, p.text_kv_heads = 4, p.text_layers = 4;
    p.mrope_section = {2, 3, 3};
    p.merges = 3000;
  });
}

PipelinePreset qwen_image_pipeline_preset(const QwenImagePreset& p, int64_t text_vocab_size) {
  PipelinePreset c;
  c.pipeline_class = "QwenImagePipeline";
  // Qwen/Qwen-Image's scheduler_config.json.
  c.scheduler = flow_match_scheduler_config(
      {{"max_image_seq_len", 8192}, {"max_shift", 0.9}, {"shift", 1.0}, {"shift_terminal", 0.02}});
  c.tokenizers = {{"tokenizer", "Qwen2Tokenizer"}};
  c.components = {{"transformer", transformer_config(p)},
                  {"vae", vae_config(p)},
                  {"text_encoder", qwen2_5_vl_config(p, text_vocab_size)}};
  int64_t axes = 0, sections = 0;
  for (int64_t a : p.axes_dims_rope) axes += a;
  for (int64_t s : p.mrope_section) sections += s;
  check_preset(axes == p.attention_head_dim, "qwen-image preset: sum(axes_dims_rope) must equal attention_head_dim");
  check_preset(2 * sections == p.text_hidden / p.text_heads,
               "qwen-image preset: mrope_section must sum to head_dim / 2");
  check_preset(p.vae_dim_mult.size() == 4, "qwen-image preset: the VAE has 4 levels (3 downsamples)");
  return c;
}

InitModelSummary write_qwen_image_pipeline(const std::string& dir, const QwenImagePreset& preset, uint64_t seed,
                                           bool force) {
  return write_pipeline_folder(dir, force, seed, [&](const fs::path& tmp, InitModelSummary& summary) {
    const ByteLevelBpe bpe = train_byte_level_bpe(bundled_corpus(), kQwen2SplitPattern, preset.merges);
    summary.text_vocab_size = write_qwen25vl_tokenizer((tmp / "tokenizer").string(), bpe);
    return qwen_image_pipeline_preset(preset, summary.text_vocab_size);
  });
}

namespace {

std::string qwen_image_details(const InitModelSummary& s) {
  return fmt::format("text vocabulary {}", s.text_vocab_size);
}

// `tprun init-model --arch qwen-image`.
ResolvedPreset resolve_qwen_image(const std::string&, const std::string& name) {
  return resolved_preset(fmt::format("Qwen-Image pipeline '{}'", name), qwen_image_preset(name),
                         write_qwen_image_pipeline, qwen_image_details);
}

}  // namespace

TPRUN_REGISTER_PRESET({"Qwen-Image", "qwen-image", "QwenImagePipeline, Qwen2.5-VL text encoder",
                       qwen_image_preset_names(), resolve_qwen_image});

}  // namespace tprun::presets
