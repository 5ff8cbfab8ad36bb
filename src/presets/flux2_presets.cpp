#include "presets/flux2_presets.h"

#include <filesystem>

#include <fmt/format.h>

#include "presets/decoder_lm_config.h"
#include "presets/hf_tokenizer_files.h"
#include "presets/preset_registry.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTransformersVersion = "5.17.0";

// The language model's sizes (hidden = joint_attention_dim / 3).
DecoderLm text_lm(const Flux2Preset& p, const char* model_type, int64_t vocab, int64_t max_positions, double rms_eps) {
  return {model_type, p.text_hidden, p.text_intermediate, p.text_heads, p.text_kv_heads, p.text_layers,
          vocab, max_positions, rms_eps};
}

// As PretrainedConfig.save_pretrained (transformers 5.17) writes them.
json qwen3_config(const Flux2Preset& p, int64_t vocab) {
  return decoder_lm_config(
      text_lm(p, "qwen3", vocab, 40960, 1e-06),
      {{"architectures", json::array({"Qwen3ForCausalLM"})},
       {"attention_bias", false},
       {"bos_token_id", nullptr},
       {"eos_token_id", nullptr},
       {"head_dim", p.text_head_dim},
       {"layer_types", std::vector<std::string>(static_cast<size_t>(p.text_layers), "full_attention")},
       {"max_window_layers", p.text_layers},
       {"pad_token_id", nullptr},
       {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
       {"sliding_window", nullptr},
       {"transformers_version", kTransformersVersion},
       {"use_sliding_window", false}});
}

json mistral3_config(const Flux2Preset& p, int64_t vocab) {
  const json text = decoder_lm_config(
      text_lm(p, "mistral", vocab, 131072, 1e-05),
      {{"bos_token_id", 1},
       {"eos_token_id", 2},
       {"head_dim", p.text_head_dim},
       {"pad_token_id", nullptr},
       {"rope_parameters", {{"rope_theta", 1000000000.0}, {"rope_type", "default"}}},
       {"sliding_window", nullptr}});
  // A small Pixtral tower: tprun never runs it, transformers must find its weights.
  const json vision = {{"attention_dropout", 0.0},
                       {"head_dim", 8},
                       {"hidden_act", "gelu"},
                       {"hidden_size", 16},
                       {"image_size", 28},
                       {"initializer_range", 0.02},
                       {"intermediate_size", 32},
                       {"model_type", "pixtral"},
                       {"num_attention_heads", 2},
                       {"num_channels", 3},
                       {"num_hidden_layers", 1},
                       {"patch_size", 14},
                       {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "axial"}}}};
  return {{"architectures", json::array({"Mistral3ForConditionalGeneration"})},
          {"image_token_index", 10},
          {"model_type", "mistral3"},
          {"multimodal_projector_bias", false},
          {"projector_hidden_act", "gelu"},
          {"spatial_merge_size", 2},
          {"text_config", text},
          {"tie_word_embeddings", false},
          {"transformers_version", kTransformersVersion},
          {"vision_config", vision},
          {"vision_feature_layer", -1}};
}

json transformer_config(const Flux2Preset& p) {
  return diffusers_config("Flux2Transformer2DModel",
                          {{"attention_head_dim", p.attention_head_dim},
                           {"axes_dims_rope", p.axes_dims_rope},
                           {"eps", 1e-06},
                           {"guidance_embeds", !p.klein},
                           {"in_channels", 4 * p.latent_channels},
                           {"joint_attention_dim", 3 * p.text_hidden},
                           {"mlp_ratio", 3.0},
                           {"num_attention_heads", p.num_attention_heads},
                           {"num_layers", p.num_layers},
                           {"num_single_layers", p.num_single_layers},
                           {"out_channels", nullptr},
                           {"patch_size", 1},
                           {"rope_theta", 2000},
                           {"timestep_guidance_channels", 256}});
}

json vae_config(const Flux2Preset& p) {
  const size_t levels = p.vae_block_out_channels.size();
  return diffusers_config("AutoencoderKLFlux2",
                          {{"act_fn", "silu"},
                           {"batch_norm_eps", 0.0001},
                           {"batch_norm_momentum", 0.1},
                           {"block_out_channels", p.vae_block_out_channels},
                           {"decoder_block_out_channels", nullptr},
                           {"down_block_types", std::vector<std::string>(levels, "DownEncoderBlock2D")},
                           {"force_upcast", true},
                           {"in_channels", 3},
                           {"latent_channels", p.latent_channels},
                           {"layers_per_block", p.vae_layers_per_block},
                           {"mid_block_add_attention", true},
                           {"norm_num_groups", p.vae_norm_num_groups},
                           {"out_channels", 3},
                           {"patch_size", {2, 2}},
                           {"sample_size", 1024},
                           {"up_block_types", std::vector<std::string>(levels, "UpDecoderBlock2D")},
                           {"use_post_quant_conv", true},
                           {"use_quant_conv", true}});
}

}  // namespace

std::vector<std::string> flux2_preset_names() { return preset_names(); }

Flux2Preset flux2_preset(const std::string& arch, const std::string& name) {
  if (arch != "flux2-klein" && arch != "flux2-dev") {
    throw ConfigError(fmt::format("--arch '{}' is not a FLUX.2 architecture (flux2-klein, flux2-dev)", arch));
  }
  Flux2Preset tiny;
  tiny.klein = arch == "flux2-klein";
  tiny.text_layers = tiny.klein ? 28 : 31;  // beyond the last stacked layer (27 / 30): that one is not post-norm
  return sized_preset(name, tiny, [](Flux2Preset& p) {  // "small": one line a component
    p.num_layers = 2, p.num_single_layers = 4, p.num_attention_heads = 4, p.attention_head_dim = 64;
    p.axes_dims_rope = {16, 16, 16, 16};
    p.latent_channels = 16, p.vae_block_out_channels = {32, 64, 64, 64}, p.vae_norm_num_groups = 32;
    p.text_hidden = 64, p.text_intermediate = 192, p.text_heads = 8, p.text_kv_heads = 4, p.text_head_dim = 16;
    p.merges = 3000;
  });
}

PipelinePreset flux2_pipeline_preset(const Flux2Preset& p, int64_t text_vocab_size) {
  PipelinePreset c;
  c.pipeline_class = p.klein ? "Flux2KleinPipeline" : "Flux2Pipeline";
  c.scheduler = flow_match_scheduler_config();
  c.tokenizers = {{"tokenizer", p.klein ? "Qwen2TokenizerFast" : "PixtralProcessor"}};
  c.components = {{"transformer", transformer_config(p)},
                  {"vae", vae_config(p)},
                  {"text_encoder", p.klein ? qwen3_config(p, text_vocab_size) : mistral3_config(p, text_vocab_size)}};
  if (p.klein) c.index_extras["is_distilled"] = false;
  int64_t axes = 0;
  for (int64_t a : p.axes_dims_rope) axes += a;
  check_preset(axes == p.attention_head_dim, "flux2 preset: sum(axes_dims_rope) must equal attention_head_dim");
  check_preset(p.text_layers > (p.klein ? 27 : 30),
               "flux2 preset: the text encoder needs the layers the pipeline stacks");
  for (int64_t ch : p.vae_block_out_channels)
    check_preset(ch % p.vae_norm_num_groups == 0, "flux2 preset: norm_num_groups must divide every VAE channel count");
  return c;
}

InitModelSummary write_flux2_pipeline(const std::string& dir, const Flux2Preset& preset, uint64_t seed, bool force) {
  return write_pipeline_folder(dir, force, seed, [&](const fs::path& tmp, InitModelSummary& summary) {
    const std::string tokenizer = (tmp / "tokenizer").string();
    const char* split = preset.klein ? kQwen2SplitPattern : kTekkenSplitPattern;
    const ByteLevelBpe bpe = train_byte_level_bpe(bundled_corpus(), split, preset.merges);
    summary.text_vocab_size =
        preset.klein ? write_qwen3_tokenizer(tokenizer, bpe) : write_mistral3_tokenizer(tokenizer, bpe);
    return flux2_pipeline_preset(preset, summary.text_vocab_size);
  });
}

namespace {

std::string flux2_details(const InitModelSummary& s) { return fmt::format("text vocabulary {}", s.text_vocab_size); }

// `tprun init-model --arch flux2-klein | flux2-dev`.
ResolvedPreset resolve_flux2(const std::string& arch, const std::string& name) {
  const Flux2Preset preset = flux2_preset(arch, name);
  return resolved_preset(fmt::format("FLUX.2 {} pipeline '{}'", preset.klein ? "[klein]" : "[dev]", name), preset,
                         write_flux2_pipeline, flux2_details);
}

}  // namespace

TPRUN_REGISTER_PRESET({"FLUX.2", "flux2-klein", "Flux2KleinPipeline, Qwen3 text encoder", flux2_preset_names(),
                       resolve_flux2});
TPRUN_REGISTER_PRESET({"FLUX.2", "flux2-dev", "Flux2Pipeline, Mistral3 text encoder", flux2_preset_names(),
                       resolve_flux2});

}  // namespace tprun::presets
