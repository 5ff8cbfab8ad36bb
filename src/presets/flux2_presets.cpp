#include "presets/flux2_presets.h"

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "presets/hf_tokenizer_files.h"
#include "presets/preset_registry.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTransformersVersion = "5.17.0";

void require(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}

json model_index(const Flux2Preset& p) {
  json j = {{"_class_name", p.klein ? "Flux2KleinPipeline" : "Flux2Pipeline"},
            {"_diffusers_version", kDiffusersVersion},
            {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
            {"text_encoder", {"transformers", p.klein ? "Qwen3ForCausalLM" : "Mistral3ForConditionalGeneration"}},
            {"tokenizer", {"transformers", p.klein ? "Qwen2TokenizerFast" : "PixtralProcessor"}},
            {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
            {"vae", {"diffusers", "AutoencoderKLFlux2"}}};
  if (p.klein) j["is_distilled"] = false;
  return j;
}

// As PretrainedConfig.save_pretrained (transformers 5.17) writes them.
json qwen3_config(const Flux2Preset& p, int64_t vocab) {
  return {{"architectures", json::array({"Qwen3ForCausalLM"})},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"head_dim", p.text_head_dim},
          {"hidden_act", "silu"},
          {"hidden_size", p.text_hidden},
          {"initializer_range", 0.02},
          {"intermediate_size", p.text_intermediate},
          {"layer_types", std::vector<std::string>(static_cast<size_t>(p.text_layers), "full_attention")},
          {"max_position_embeddings", 40960},
          {"max_window_layers", p.text_layers},
          {"model_type", "qwen3"},
          {"num_attention_heads", p.text_heads},
          {"num_hidden_layers", p.text_layers},
          {"num_key_value_heads", p.text_kv_heads},
          {"pad_token_id", nullptr},
          {"rms_norm_eps", 1e-06},
          {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", false},
          {"transformers_version", kTransformersVersion},
          {"use_cache", true},
          {"use_sliding_window", false},
          {"vocab_size", vocab}};
}

json mistral3_config(const Flux2Preset& p, int64_t vocab) {
  const json text = {{"attention_dropout", 0.0},
                     {"bos_token_id", 1},
                     {"eos_token_id", 2},
                     {"head_dim", p.text_head_dim},
                     {"hidden_act", "silu"},
                     {"hidden_size", p.text_hidden},
                     {"initializer_range", 0.02},
                     {"intermediate_size", p.text_intermediate},
                     {"max_position_embeddings", 131072},
                     {"model_type", "mistral"},
                     {"num_attention_heads", p.text_heads},
                     {"num_hidden_layers", p.text_layers},
                     {"num_key_value_heads", p.text_kv_heads},
                     {"pad_token_id", nullptr},
                     {"rms_norm_eps", 1e-05},
                     {"rope_parameters", {{"rope_theta", 1000000000.0}, {"rope_type", "default"}}},
                     {"sliding_window", nullptr},
                     {"tie_word_embeddings", false},
                     {"use_cache", true},
                     {"vocab_size", vocab}};
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

}  // namespace

std::vector<std::string> flux2_preset_names() { return {"tiny", "small"}; }

Flux2Preset flux2_preset(const std::string& arch, const std::string& name) {
  if (arch != "flux2-klein" && arch != "flux2-dev") {
    throw ConfigError(fmt::format("--arch '{}' is not a FLUX.2 architecture (flux2-klein, flux2-dev)", arch));
  }
  Flux2Preset p;  // the defaults are "tiny"
  p.name = name;
  p.klein = arch == "flux2-klein";
  p.text_layers = p.klein ? 28 : 31;  // beyond the last stacked layer (27 / 30): that one is not post-norm
  if (name == "tiny") return p;
  if (name == "small") {
    p.num_layers = 2;
    p.num_single_layers = 4;
    p.num_attention_heads = 4;
    p.attention_head_dim = 64;
    p.axes_dims_rope = {16, 16, 16, 16};
    p.latent_channels = 16;
    p.vae_block_out_channels = {32, 64, 64, 64};
    p.vae_norm_num_groups = 32;
    p.text_hidden = 64;
    p.text_intermediate = 192;
    p.text_heads = 8;
    p.text_kv_heads = 4;
    p.text_head_dim = 16;
    p.merges = 3000;
    return p;
  }
  throw ConfigError(fmt::format("unknown preset '{}'; choose one of: {}", name, fmt::join(flux2_preset_names(), ", ")));
}

Flux2PipelineConfigs flux2_pipeline_configs(const Flux2Preset& p, int64_t text_vocab_size) {
  Flux2PipelineConfigs c;
  c.model_index = model_index(p);
  c.scheduler = flow_match_scheduler_config();
  c.transformer = {{"_class_name", "Flux2Transformer2DModel"},
                   {"_diffusers_version", kDiffusersVersion},
                   {"attention_head_dim", p.attention_head_dim},
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
                   {"timestep_guidance_channels", 256}};
  const size_t levels = p.vae_block_out_channels.size();
  c.vae = {{"_class_name", "AutoencoderKLFlux2"},
           {"_diffusers_version", kDiffusersVersion},
           {"act_fn", "silu"},
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
           {"use_quant_conv", true}};
  c.text_encoder = p.klein ? qwen3_config(p, text_vocab_size) : mistral3_config(p, text_vocab_size);
  int64_t axes = 0;
  for (int64_t a : p.axes_dims_rope) axes += a;
  require(axes == p.attention_head_dim, "flux2 preset: sum(axes_dims_rope) must equal attention_head_dim");
  require(p.text_layers > (p.klein ? 27 : 30), "flux2 preset: the text encoder needs the layers the pipeline stacks");
  for (int64_t ch : p.vae_block_out_channels)
    require(ch % p.vae_norm_num_groups == 0, "flux2 preset: norm_num_groups must divide every VAE channel count");
  return c;
}

InitModelSummary write_flux2_pipeline(const std::string& dir, const Flux2Preset& preset, uint64_t seed, bool force) {
  InitModelSummary summary;
  write_output_folder(dir, force, [&](const fs::path& tmp) {
    const std::string tokenizer = (tmp / "tokenizer").string();
    if (preset.klein) {
      summary.text_vocab_size =
          write_qwen3_tokenizer(tokenizer, train_byte_level_bpe(bundled_corpus(), kQwen2SplitPattern, preset.merges));
    } else {
      summary.text_vocab_size = write_mistral3_tokenizer(
          tokenizer, train_byte_level_bpe(bundled_corpus(), kTekkenSplitPattern, preset.merges));
    }
    const Flux2PipelineConfigs c = flux2_pipeline_configs(preset, summary.text_vocab_size);
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

// `tprun init-model --arch flux2-klein | flux2-dev`.
ResolvedPreset resolve_flux2(const std::string& arch, const std::string& name) {
  const Flux2Preset preset = flux2_preset(arch, name);
  return {fmt::format("FLUX.2 {} pipeline '{}'", preset.klein ? "[klein]" : "[dev]", name),
          [preset](const std::string& dir, uint64_t seed, bool force) {
            WrittenPreset w;
            w.summary = write_flux2_pipeline(dir, preset, seed, force);
            w.details = fmt::format("text vocabulary {}", w.summary.text_vocab_size);
            return w;
          }};
}

}  // namespace

TPRUN_REGISTER_PRESET({"FLUX.2", "flux2-klein", "Flux2KleinPipeline, Qwen3 text encoder", flux2_preset_names(),
                       resolve_flux2});
TPRUN_REGISTER_PRESET({"FLUX.2", "flux2-dev", "Flux2Pipeline, Mistral3 text encoder", flux2_preset_names(),
                       resolve_flux2});

}  // namespace tprun::presets
