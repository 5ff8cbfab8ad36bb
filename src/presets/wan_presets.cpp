#include "presets/wan_presets.h"

#include <filesystem>

#include <fmt/format.h>

#include "presets/preset_registry.h"
#include "presets/t5_encoder_config.h"
#include "presets/tokenizer_files.h"
#include "presets/umt5_tokenizer_files.h"
#include "runtime/error.h"

namespace tprun::presets {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kLatentChannels = 16;     // AutoencoderKLWan's z_dim: the transformer's in/out channels
constexpr int64_t kUmt5VocabMultiple = 128;  // umt5-xxl: 256,384 rows for its 256,300 tokens
constexpr double kBoundaryRatio = 0.875;     // Wan2.2-T2V-A14B-Diffusers' model_index.json

// Wan 2.1's VAE statistics, per latent channel (Wan-AI/Wan2.1-T2V-1.3B-Diffusers' vae/config.json).
const std::vector<double> kLatentsMean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                                          0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
const std::vector<double> kLatentsStd = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                         3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916};

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t get_int(const json& config, const char* field, const std::string& component) {
  if (!config.contains(field) || !config[field].is_number_integer())
    throw ConfigError(fmt::format("{}/config.json: field '{}' missing or not an integer", component, field));
  return config[field].get<int64_t>();
}

// The keys diffusers 0.40's save_pretrained writes for WanTransformer3DModel.
json transformer_config(const WanPreset& p, int64_t text_dim) {
  return diffusers_config("WanTransformer3DModel",
                          {{"added_kv_proj_dim", nullptr},
                           {"attention_head_dim", p.attention_head_dim},
                           {"cross_attn_norm", true},
                           {"eps", 1e-06},
                           {"ffn_dim", p.ffn_dim},
                           {"freq_dim", 256},
                           {"image_dim", nullptr},
                           {"in_channels", kLatentChannels},
                           {"num_attention_heads", p.num_attention_heads},
                           {"num_layers", p.num_layers},
                           {"out_channels", kLatentChannels},
                           {"patch_size", {1, 2, 2}},
                           {"pos_embed_seq_len", nullptr},
                           {"qk_norm", "rms_norm_across_heads"},
                           {"rope_max_seq_len", 1024},
                           {"text_dim", text_dim}});
}

// AutoencoderKLWan as diffusers 0.40 saves it (the Wan 2.1 VAE: no patching,
// not residual, one base width for encoder and decoder).
json vae_config(const WanPreset& p) {
  return diffusers_config("AutoencoderKLWan",
                          {{"attn_scales", json::array()},
                           {"base_dim", p.vae_base_dim},
                           {"decoder_base_dim", nullptr},
                           {"dim_mult", p.vae_dim_mult},
                           {"dropout", 0.0},
                           {"in_channels", 3},
                           {"is_residual", false},
                           {"latents_mean", kLatentsMean},
                           {"latents_std", kLatentsStd},
                           {"num_res_blocks", p.vae_res_blocks},
                           {"out_channels", 3},
                           {"patch_size", nullptr},
                           {"scale_factor_spatial", 8},
                           {"scale_factor_temporal", 4},
                           {"temperal_downsample", {false, true, true}},
                           {"z_dim", kLatentChannels}});
}

// UMT5EncoderModel as transformers 5.17 re-saves google/umt5-xxl's config
// (the hub's extra keys output_past, scalable_attention, tokenizer_class kept;
// 5.17 writes tie_word_embeddings true and saves only shared.weight).
json umt5_config(const WanPreset& p, int64_t vocab_size) {
  return t5_encoder_config({"umt5", p.text_d_model, p.text_d_ff, p.text_d_kv, p.text_heads, p.text_layers, vocab_size},
                           {{"architectures", json::array({"UMT5EncoderModel"})},
                            {"is_decoder", false},
                            {"is_encoder_decoder", true},
                            {"output_past", true},
                            {"scalable_attention", true},
                            {"tie_word_embeddings", true},
                            {"tokenizer_class", "T5Tokenizer"},
                            {"transformers_version", "5.17.0"},
                            {"use_cache", true}});
}

// UniPCMultistepScheduler as the Wan 2.1 / 2.2 T2V folders ship it, in the
// keys diffusers 0.40 writes.
json unipc_scheduler_config() {
  return {{"_class_name", "UniPCMultistepScheduler"},
          {"_diffusers_version", kDiffusersVersion},
          {"beta_end", 0.02},
          {"beta_schedule", "linear"},
          {"beta_start", 0.0001},
          {"disable_corrector", json::array()},
          {"dynamic_thresholding_ratio", 0.995},
          {"final_sigmas_type", "zero"},
          {"flow_shift", 3.0},
          {"lower_order_final", true},
          {"num_train_timesteps", 1000},
          {"predict_x0", true},
          {"prediction_type", "flow_prediction"},
          {"rescale_betas_zero_snr", false},
          {"sample_max_value", 1.0},
          {"shift_terminal", nullptr},
          {"sigma_max", nullptr},
          {"sigma_min", nullptr},
          {"solver_order", 2},
          {"solver_p", nullptr},
          {"solver_type", "bh2"},
          {"steps_offset", 0},
          {"thresholding", false},
          {"time_shift_type", "exponential"},
          {"timestep_spacing", "linspace"},
          {"trained_betas", nullptr},
          {"use_beta_sigmas", false},
          {"use_dynamic_shifting", false},
          {"use_exponential_sigmas", false},
          {"use_flow_sigmas", true},
          {"use_karras_sigmas", false}};
}

}  // namespace

std::vector<std::string> wan_preset_names() { return preset_names(); }

WanPreset wan_preset(const std::string& arch, const std::string& name) {
  if (arch != "wan" && arch != "wan-a14b")
    throw ConfigError(fmt::format("--arch '{}' is not a Wan architecture (wan, wan-a14b)", arch));
  WanPreset tiny;
  tiny.two_experts = arch == "wan-a14b";
  return sized_preset(name, tiny, [](WanPreset& p) {  // "small": one line a component
    p.num_layers = 4, p.num_attention_heads = 4, p.attention_head_dim = 48, p.ffn_dim = 576;
    p.text_d_model = 128, p.text_d_kv = 32, p.text_heads = 4, p.text_d_ff = 256, p.text_layers = 2;
    p.vae_base_dim = 16, p.vae_res_blocks = 2, p.vae_dim_mult = {1, 2, 4, 4};
    p.text_pieces = 1000;
  });
}

PipelinePreset wan_pipeline_preset(const WanPreset& p, int64_t tokenizer_length) {
  PipelinePreset c;
  c.pipeline_class = "WanPipeline";
  c.scheduler = unipc_scheduler_config();
  c.tokenizers = {{"tokenizer", "T5TokenizerFast"}};
  const json transformer = transformer_config(p, p.text_d_model);
  c.components = {{"transformer", transformer}};
  if (p.two_experts) c.components.push_back({"transformer_2", transformer});
  c.components.push_back({"vae", vae_config(p)});
  c.components.push_back({"text_encoder", umt5_config(p, round_up(tokenizer_length, kUmt5VocabMultiple))});
  // As WanPipeline.save_pretrained writes them (register_to_config of both
  // keys; an absent transformer_2 as [null, null]).
  c.index_extras = {{"boundary_ratio", p.two_experts ? json(kBoundaryRatio) : json(nullptr)},
                    {"expand_timesteps", false}};
  if (!p.two_experts) c.index_extras["transformer_2"] = {nullptr, nullptr};
  check_wan_pipeline_preset(c, tokenizer_length);
  return c;
}

void check_wan_pipeline_preset(const PipelinePreset& c, int64_t tokenizer_length) {
  const json &t = c.config("transformer"), &v = c.config("vae"), &te = c.config("text_encoder");
  const int64_t heads = get_int(t, "num_attention_heads", "transformer"),
                head_dim = get_int(t, "attention_head_dim", "transformer");
  check_preset(heads > 0 && head_dim > 0 && get_int(t, "num_layers", "transformer") > 0 &&
                   get_int(t, "ffn_dim", "transformer") > 0,
               "transformer/config.json: num_attention_heads, attention_head_dim, num_layers and ffn_dim must be "
               "positive");
  check_preset(head_dim % 2 == 0 && head_dim / 6 > 0,
               fmt::format("transformer/config.json: attention_head_dim {} must be even and at least 6 (the 3-D "
                           "RoPE's time, height and width parts)",
                           head_dim));
  check_preset(get_int(t, "in_channels", "transformer") == get_int(v, "z_dim", "vae") &&
                   get_int(t, "out_channels", "transformer") == get_int(v, "z_dim", "vae"),
               "transformer/config.json in_channels and out_channels must equal vae/config.json z_dim");
  const int64_t z = get_int(v, "z_dim", "vae");
  check_preset(v.at("latents_mean").size() == static_cast<size_t>(z) &&
                   v.at("latents_std").size() == static_cast<size_t>(z),
               "vae/config.json: latents_mean and latents_std need z_dim values each");
  check_preset(v.at("dim_mult").size() == 4 && v.at("temperal_downsample").size() == 3,
               "vae/config.json: the Wan VAE has 4 levels (dim_mult) and 3 downsamples (temperal_downsample)");
  check_preset(get_int(v, "base_dim", "vae") > 0 && get_int(v, "num_res_blocks", "vae") > 0,
               "vae/config.json: base_dim and num_res_blocks must be positive");
  check_preset(get_int(t, "text_dim", "transformer") == get_int(te, "d_model", "text_encoder"),
               "transformer/config.json text_dim must equal text_encoder/config.json d_model");
  check_preset(get_int(te, "num_heads", "text_encoder") > 0 && get_int(te, "d_kv", "text_encoder") > 0 &&
                   get_int(te, "num_layers", "text_encoder") > 0,
               "text_encoder/config.json: num_heads, d_kv and num_layers must be positive");
  check_preset(get_int(te, "vocab_size", "text_encoder") >= tokenizer_length,
               fmt::format("text_encoder/config.json vocab_size {} is below the tokenizer's length {}",
                           get_int(te, "vocab_size", "text_encoder"), tokenizer_length));
  const json index = c.model_index();
  const bool two = index.contains("transformer_2") && index["transformer_2"].is_array() &&
                   !index["transformer_2"].empty() && !index["transformer_2"][0].is_null();
  if (two) {
    check_preset(c.config("transformer_2") == t,
                 "transformer_2/config.json must equal transformer/config.json (the two experts of one model)");
    check_preset(index.value("boundary_ratio", json()).is_number(),
                 "model_index.json: a folder with transformer_2 needs a boundary_ratio");
  }
}

InitModelSummary write_wan_pipeline(const std::string& dir, const WanPreset& preset, uint64_t seed, bool force) {
  return write_pipeline_folder(dir, force, seed, [&](const fs::path& tmp, InitModelSummary& summary) {
    // UMT5's layout (unigram, <pad> </s> <unk>, byte pieces, 300 sentinels), learned from the bundled text.
    summary.text_vocab_size =
        write_umt5_tokenizer((tmp / "tokenizer").string(), bundled_corpus(), static_cast<int>(preset.text_pieces));
    return wan_pipeline_preset(preset, summary.text_vocab_size);
  });
}

namespace {

std::string wan_details(const InitModelSummary& s) { return fmt::format("UMT5 tokenizer {}", s.text_vocab_size); }

// `tprun init-model --arch wan | wan-a14b`.
ResolvedPreset resolve_wan(const std::string& arch, const std::string& name) {
  const WanPreset preset = wan_preset(arch, name);
  return resolved_preset(fmt::format("Wan {} pipeline '{}'", preset.two_experts ? "2.2 A14B" : "2.1", name), preset,
                         write_wan_pipeline, wan_details);
}

}  // namespace

TPRUN_REGISTER_PRESET({"Wan", "wan", "Wan 2.1 text to video, WanPipeline", wan_preset_names(), resolve_wan});
TPRUN_REGISTER_PRESET({"Wan", "wan-a14b", "Wan 2.2 A14B, WanPipeline with two experts", wan_preset_names(),
                       resolve_wan});

}  // namespace tprun::presets
