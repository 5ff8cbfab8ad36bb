#include "presets/flux_presets.h"

#include <filesystem>
#include <numeric>

#include <fmt/format.h>

#include "text/bpe_trainer.h"
#include "presets/preset_registry.h"
#include "presets/t5_encoder_config.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTransformersVersion = "4.57.6";  // the config layout of the reference text encoders
constexpr int64_t kLatentChannels = 16;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t get_int(const json& config, const char* field, const char* component) {
  if (!config.contains(field) || !config[field].is_number_integer())
    throw ConfigError(fmt::format("{}/config.json: field '{}' missing or not an integer", component, field));
  return config[field].get<int64_t>();
}

json transformer_config(const FluxPreset& p) {
  return diffusers_config("FluxTransformer2DModel",
                          {{"attention_head_dim", p.attention_head_dim},
                           {"axes_dims_rope", p.axes_dims_rope},
                           {"guidance_embeds", true},
                           {"in_channels", 4 * kLatentChannels},
                           {"joint_attention_dim", p.t5_d_model},
                           {"num_attention_heads", p.num_attention_heads},
                           {"num_layers", p.num_layers},
                           {"num_single_layers", p.num_single_layers},
                           {"out_channels", nullptr},
                           {"patch_size", 1},
                           {"pooled_projection_dim", p.clip_hidden}});
}

json vae_config(const FluxPreset& p) {
  const size_t levels = p.vae_block_out_channels.size();
  return diffusers_config("AutoencoderKL",
                          {{"act_fn", "silu"},
                           {"block_out_channels", p.vae_block_out_channels},
                           {"down_block_types", std::vector<std::string>(levels, "DownEncoderBlock2D")},
                           {"force_upcast", true},
                           {"in_channels", 3},
                           {"latent_channels", kLatentChannels},
                           {"latents_mean", nullptr},
                           {"latents_std", nullptr},
                           {"layers_per_block", p.vae_layers_per_block},
                           {"mid_block_add_attention", true},
                           {"norm_num_groups", p.vae_norm_num_groups},
                           {"out_channels", 3},
                           {"sample_size", p.vae_sample_size},
                           {"scaling_factor", 0.3611},
                           {"shift_factor", 0.1159},
                           {"up_block_types", std::vector<std::string>(levels, "UpDecoderBlock2D")},
                           {"use_post_quant_conv", false},
                           {"use_quant_conv", false}});
}

// As PretrainedConfig.save_pretrained writes them (FLUX.1's text_encoder/
// and text_encoder_2/, the layout of shared/ref/TEXT.md).
json clip_config(const FluxPreset& p, int64_t clip_vocab_size) {
  return {{"architectures", json::array({"CLIPTextModel"})},
          {"attention_dropout", 0.0},
          {"bos_token_id", 0},
          {"dtype", "float32"},
          {"eos_token_id", 2},
          {"hidden_act", "quick_gelu"},
          {"hidden_size", p.clip_hidden},
          {"initializer_factor", 1.0},
          {"initializer_range", 0.02},
          {"intermediate_size", p.clip_intermediate},
          {"layer_norm_eps", 1e-05},
          {"max_position_embeddings", 77},
          {"model_type", "clip_text_model"},
          {"num_attention_heads", p.clip_heads},
          {"num_hidden_layers", p.clip_layers},
          {"pad_token_id", 1},
          {"projection_dim", p.clip_hidden},
          {"transformers_version", kTransformersVersion},
          {"vocab_size", clip_vocab_size}};
}

json t5_config(const FluxPreset& p, int64_t t5_tokenizer_length) {
  return t5_encoder_config({"t5", p.t5_d_model, p.t5_d_ff, p.t5_d_kv, p.t5_heads, p.t5_layers,
                            round_up(t5_tokenizer_length, 64)},
                           {{"architectures", json::array({"T5EncoderModel"})},
                            {"is_encoder_decoder", false},
                            {"tie_word_embeddings", false},
                            {"transformers_version", kTransformersVersion},
                            {"use_cache", false}});
}

}  // namespace

std::vector<std::string> flux_preset_names() { return preset_names(); }

FluxPreset flux_preset(const std::string& name) {
  return sized_preset(name, FluxPreset{}, [](FluxPreset& p) {  // "small": one line a component
    p.num_layers = 2, p.num_single_layers = 4, p.num_attention_heads = 4, p.attention_head_dim = 64;
    p.axes_dims_rope = {8, 28, 28};
    p.clip_hidden = 64, p.clip_intermediate = 256, p.clip_layers = 4, p.clip_heads = 4;
    p.t5_d_model = 128, p.t5_layers = 2, p.t5_heads = 4, p.t5_d_kv = 32, p.t5_d_ff = 256;
    p.vae_block_out_channels = {32, 64, 64, 64}, p.vae_norm_num_groups = 32, p.vae_sample_size = 256;
  });
}

PipelinePreset flux_pipeline_preset(const FluxPreset& p, int64_t clip_vocab_size, int64_t t5_tokenizer_length) {
  PipelinePreset c;
  c.pipeline_class = "FluxPipeline";
  c.scheduler = flow_match_scheduler_config();  // FLUX.1-dev's (shared/ref/flow_match_scheduler)
  c.tokenizers = {{"tokenizer", "CLIPTokenizer"}, {"tokenizer_2", "T5TokenizerFast"}};
  c.components = {{"transformer", transformer_config(p)},
                  {"vae", vae_config(p)},
                  {"text_encoder", clip_config(p, clip_vocab_size)},
                  {"text_encoder_2", t5_config(p, t5_tokenizer_length)}};
  c.index_extras = {{"feature_extractor", {nullptr, nullptr}}, {"image_encoder", {nullptr, nullptr}}};
  check_flux_pipeline_preset(c, clip_vocab_size, t5_tokenizer_length);
  return c;
}

void check_flux_pipeline_preset(const PipelinePreset& c, int64_t clip_vocab_size, int64_t t5_tokenizer_length) {
  const json &t = c.config("transformer"), &v = c.config("vae"), &clip = c.config("text_encoder"),
             &t5 = c.config("text_encoder_2");
  const int64_t heads = get_int(t, "num_attention_heads", "transformer"),
                head_dim = get_int(t, "attention_head_dim", "transformer");
  check_preset(heads > 0 && head_dim > 0 && get_int(t, "num_layers", "transformer") >= 0 &&
                   get_int(t, "num_single_layers", "transformer") >= 0,
               "transformer/config.json: sizes must be positive");
  int64_t axes = 0;
  for (const auto& a : t.at("axes_dims_rope")) axes += a.get<int64_t>();
  check_preset(axes == head_dim, fmt::format("transformer/config.json: sum(axes_dims_rope) = {} must equal "
                                             "attention_head_dim = {}",
                                             axes, head_dim));
  check_preset(get_int(t, "in_channels", "transformer") == 4 * get_int(v, "latent_channels", "vae"),
               "transformer/config.json in_channels must be 4 * vae/config.json latent_channels");
  check_preset(get_int(t, "pooled_projection_dim", "transformer") == get_int(clip, "hidden_size", "text_encoder"),
               "transformer/config.json pooled_projection_dim must equal text_encoder/config.json hidden_size");
  check_preset(get_int(t, "joint_attention_dim", "transformer") == get_int(t5, "d_model", "text_encoder_2"),
               "transformer/config.json joint_attention_dim must equal text_encoder_2/config.json d_model");
  check_preset(get_int(clip, "vocab_size", "text_encoder") == clip_vocab_size,
               fmt::format("text_encoder/config.json vocab_size {} must equal the CLIP tokenizer's {}",
                           get_int(clip, "vocab_size", "text_encoder"), clip_vocab_size));
  check_preset(get_int(t5, "vocab_size", "text_encoder_2") >= t5_tokenizer_length,
               fmt::format("text_encoder_2/config.json vocab_size {} is below the T5 tokenizer's length {}",
                           get_int(t5, "vocab_size", "text_encoder_2"), t5_tokenizer_length));
  const int64_t clip_heads = get_int(clip, "num_attention_heads", "text_encoder");
  check_preset(clip_heads > 0 && get_int(clip, "hidden_size", "text_encoder") % clip_heads == 0,
               "text_encoder/config.json: num_attention_heads must divide hidden_size");
  const int64_t groups = get_int(v, "norm_num_groups", "vae");
  for (const auto& ch : v.at("block_out_channels"))
    check_preset(groups > 0 && ch.get<int64_t>() % groups == 0,
                 fmt::format("vae/config.json: norm_num_groups {} must divide every block_out_channels entry ({})",
                             groups, ch.get<int64_t>()));
}

InitModelSummary write_flux_pipeline(const std::string& dir, const FluxPreset& preset, uint64_t seed, bool force) {
  return write_pipeline_folder(dir, force, seed, [&](const fs::path& tmp, InitModelSummary& summary) {
    const auto& corpus = bundled_corpus();
    summary.clip_vocab_size =
        write_clip_tokenizer((tmp / "tokenizer").string(), text::train_clip_bpe(corpus, preset.clip_merges));
    summary.t5_tokenizer_length =
        write_t5_tokenizer((tmp / "tokenizer_2").string(), train_t5_sentencepiece(corpus, preset.t5_pieces));
    return flux_pipeline_preset(preset, summary.clip_vocab_size, summary.t5_tokenizer_length);
  });
}

namespace {

std::string flux_details(const InitModelSummary& s) {
  return fmt::format("CLIP vocabulary {}, T5 tokenizer {}", s.clip_vocab_size, s.t5_tokenizer_length);
}

// `tprun init-model --arch flux`.
ResolvedPreset resolve_flux(const std::string&, const std::string& name) {
  return resolved_preset(fmt::format("FLUX.1 pipeline '{}'", name), flux_preset(name), write_flux_pipeline,
                         flux_details);
}

}  // namespace

TPRUN_REGISTER_PRESET({"FLUX.1", "flux", "FLUX.1, FluxPipeline", flux_preset_names(), resolve_flux});

}  // namespace tprun::presets
