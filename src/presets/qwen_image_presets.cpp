#include "presets/qwen_image_presets.h"

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "presets/hf_tokenizer_files.h"
#include "presets/preset_registry.h"
#include "presets/qwen_image_tokenizer_files.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}

json model_index() {
  return {{"_class_name", "QwenImagePipeline"},
          {"_diffusers_version", kDiffusersVersion},
          {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
          {"text_encoder", {"transformers", "Qwen2_5_VLForConditionalGeneration"}},
          {"tokenizer", {"transformers", "Qwen2Tokenizer"}},
          {"transformer", {"diffusers", "QwenImageTransformer2DModel"}},
          {"vae", {"diffusers", "AutoencoderKLQwenImage"}}};
}

// Qwen/Qwen-Image's scheduler_config.json.
json qwen_image_scheduler() {
  return {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
          {"_diffusers_version", kDiffusersVersion},
          {"base_image_seq_len", 256},
          {"base_shift", 0.5},
          {"invert_sigmas", false},
          {"max_image_seq_len", 8192},
          {"max_shift", 0.9},
          {"num_train_timesteps", 1000},
          {"shift", 1.0},
          {"shift_terminal", 0.02},
          {"stochastic_sampling", false},
          {"time_shift_type", "exponential"},
          {"use_beta_sigmas", false},
          {"use_dynamic_shifting", true},
          {"use_exponential_sigmas", false},
          {"use_karras_sigmas", false}};
}

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
  return {{"architectures", json::array({"Qwen2_5_VLForConditionalGeneration"})},
          {"attention_dropout", 0.0},
          {"hidden_act", "silu"},
          {"hidden_size", p.text_hidden},
          {"initializer_range", 0.02},
          {"intermediate_size", p.text_intermediate},
          {"max_position_embeddings", 128000},
          {"max_window_layers", p.text_layers},
          {"model_type", "qwen2_5_vl"},
          {"num_attention_heads", p.text_heads},
          {"num_hidden_layers", p.text_layers},
          {"num_key_value_heads", p.text_kv_heads},
          {"rms_norm_eps", 1e-06},
          {"rope_scaling", {{"mrope_section", p.mrope_section}, {"rope_type", "default"}, {"type", "mrope"}}},
          {"rope_theta", 1000000.0},
          {"sliding_window", 32768},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"},
          {"transformers_version", "4.53.1"},
          {"use_cache", true},
          {"use_sliding_window", false},
          {"vision_config", vision},
          {"vocab_size", vocab}};
}

std::vector<double> latent_statistics(int64_t n, double first, double step) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(first + step * static_cast<double>(i));
  return v;
}

}  // namespace

std::vector<std::string> qwen_image_preset_names() { return {"tiny", "small"}; }

QwenImagePreset qwen_image_preset(const std::string& name) {
  QwenImagePreset p;  // the defaults are "tiny"
  p.name = name;
  if (name == "tiny") return p;
  if (name == "small") {
    p.num_layers = 4;
    p.num_attention_heads = 4;
    p.attention_head_dim = 64;
    p.axes_dims_rope = {16, 24, 24};
    p.z_dim = 16;
    p.vae_base_dim = 32;
    p.text_hidden = 128;
    p.text_intermediate = 384;
    p.text_heads = 8;
    p.text_kv_heads = 4;
    p.text_layers = 4;
    p.mrope_section = {2, 3, 3};
    p.merges = 3000;
    return p;
  }
  throw ConfigError(
      fmt::format("unknown preset '{}'; choose one of: {}", name, fmt::join(qwen_image_preset_names(), ", ")));
}

QwenImagePipelineConfigs qwen_image_pipeline_configs(const QwenImagePreset& p, int64_t text_vocab_size) {
  QwenImagePipelineConfigs c;
  c.model_index = model_index();
  c.scheduler = qwen_image_scheduler();
  c.transformer = {{"_class_name", "QwenImageTransformer2DModel"},
                   {"_diffusers_version", kDiffusersVersion},
                   {"attention_head_dim", p.attention_head_dim},
                   {"axes_dims_rope", p.axes_dims_rope},
                   {"guidance_embeds", false},
                   {"in_channels", 4 * p.z_dim},
                   {"joint_attention_dim", p.text_hidden},
                   {"num_attention_heads", p.num_attention_heads},
                   {"num_layers", p.num_layers},
                   {"out_channels", p.z_dim},
                   {"patch_size", 2},
                   {"pooled_projection_dim", 768}};
  c.vae = {{"_class_name", "AutoencoderKLQwenImage"},
           {"_diffusers_version", kDiffusersVersion},
           {"attn_scales", json::array()},
           {"base_dim", p.vae_base_dim},
           {"dim_mult", p.vae_dim_mult},
           {"dropout", 0.0},
           {"latents_mean", latent_statistics(p.z_dim, -0.3, 0.05)},
           {"latents_std", latent_statistics(p.z_dim, 1.5, 0.25)},
           {"num_res_blocks", p.vae_res_blocks},
           {"temperal_downsample", {false, true, true}},
           {"z_dim", p.z_dim}};
  c.text_encoder = qwen2_5_vl_config(p, text_vocab_size);
  int64_t axes = 0, sections = 0;
  for (int64_t a : p.axes_dims_rope) axes += a;
  for (int64_t s : p.mrope_section) sections += s;
  require(axes == p.attention_head_dim, "qwen-image preset: sum(axes_dims_rope) must equal attention_head_dim");
  require(2 * sections == p.text_hidden / p.text_heads, "qwen-image preset: mrope_section must sum to head_dim / 2");
  require(p.vae_dim_mult.size() == 4, "qwen-image preset: the VAE has 4 levels (3 downsamples)");
  return c;
}

InitModelSummary write_qwen_image_pipeline(const std::string& dir, const QwenImagePreset& preset, uint64_t seed,
                                           bool force) {
  InitModelSummary summary;
  write_output_folder(dir, force, [&](const fs::path& tmp) {
    summary.text_vocab_size = write_qwen25vl_tokenizer(
        (tmp / "tokenizer").string(), train_byte_level_bpe(bundled_corpus(), kQwen2SplitPattern, preset.merges));
    const QwenImagePipelineConfigs c = qwen_image_pipeline_configs(preset, summary.text_vocab_size);
    write_json(tmp / "model_index.json", c.model_index);
    fs::create_directories(tmp / "scheduler");
    write_json(tmp / "scheduler" / "scheduler_config.json", c.scheduler);
    write_component(tmp, "transformer", c.transformer, "diffusion_pytorch_model.safetensors", seed, summary);
    write_component(tmp, "vae", c.vae, "diffusion_pytorch_model.safetensors", seed, summary);
    write_component(tmp, "text_encoder", c.text_encoder, "model.safetensors", seed, summary);
  });
  return summary;
}

namespace {

// `tprun init-model --arch qwen-image`.
ResolvedPreset resolve_qwen_image(const std::string& arch, const std::string& name) {
  const QwenImagePreset preset = qwen_image_preset(name);
  return {fmt::format("Qwen-Image pipeline '{}'", name), [preset](const std::string& dir, uint64_t seed, bool force) {
            WrittenPreset w;
            w.summary = write_qwen_image_pipeline(dir, preset, seed, force);
            w.details = fmt::format("text vocabulary {}", w.summary.text_vocab_size);
            return w;
          }};
}

}  // namespace

TPRUN_REGISTER_PRESET({"Qwen-Image", "qwen-image", "QwenImagePipeline, Qwen2.5-VL text encoder",
                       qwen_image_preset_names(), resolve_qwen_image});

}  // namespace tprun::presets
