// The config.json of the decoder-only text encoders (decoder_text_encoder.h):
// Qwen3Config, Mistral3Config's text_config, Qwen2_5_VLConfig's text model
// (nested text_config or the flat fields of the hub's files) and the vision
// configs whose tensor shapes the table declares. Each reader follows the
// transformers 5.17 config class: the same defaults, the same precedence
// (rope_scaling over rope_parameters, a nested text_config over top-level
// fields), every value bounded and every malformed one refused with a
// CheckpointError naming the file and the field (ConfigError for a feature
// tprun does not run) before any table is recorded.
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/decoder_text_encoder.h"
#include "models/model_config.h"
#include "models/text_encoder_common.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

using nlohmann::json;

constexpr const char* kQwen3 = "Qwen3ForCausalLM";
constexpr const char* kMistral3 = "Mistral3ForConditionalGeneration";
constexpr const char* kQwen2_5_VL = "Qwen2_5_VLForConditionalGeneration";

// An object field; nullptr when absent or null.
const json* object_field(const json& c, const char* field, const std::string& path) {
  if (!c.contains(field) || c[field].is_null()) return nullptr;
  if (!c[field].is_object()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be an object, found {}", path, field, c[field].dump()));
  }
  return &c[field];
}

std::optional<double> optional_positive(const json& c, const std::string& field, const std::string& path,
                                        double max) {
  if (!c.contains(field) || c[field].is_null()) return std::nullopt;
  return config_positive_number(c, field, path, 1.0, max);
}

// An optional size: nullopt when the field is null, `absent` when missing.
std::optional<int64_t> nullable_positive(const json& c, const char* field, const std::string& path,
                                         std::optional<int64_t> absent, int64_t max) {
  if (!c.contains(field)) return absent;
  if (c[field].is_null()) return std::nullopt;
  return config_positive_required(c, field, path, max);
}

// Qwen2.5-VL's mrope_section: 3 non-negative integers (temporal, height,
// width) summing to head_dim / 2 (the rotary class splits the D/2 frequency
// columns by them); absent: the rotary class's default [16, 24, 24].
std::vector<int64_t> parse_mrope_section(const json& p, const std::string& where, int64_t half_dim) {
  const json s = p.contains("mrope_section") ? p["mrope_section"] : json::array({16, 24, 24});
  const auto refuse = [&](const std::string& why) {
    return CheckpointError(fmt::format("{}: field 'mrope_section' = {} {}", where, clip_text(s.dump()), why));
  };
  if (!s.is_array() || s.size() != 3) {
    throw refuse("must list 3 integers (the temporal, height and width sections of the rotary frequencies)");
  }
  std::vector<int64_t> out;
  int64_t sum = 0;
  for (const json& v : s) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > half_dim) {
      throw refuse(fmt::format("must hold integers in [0, {}] (head_dim / 2)", half_dim));
    }
    out.push_back(v.get<int64_t>());
    sum += out.back();
  }
  if (sum != half_dim) {
    throw refuse(fmt::format("{}sums to {}, not head_dim / 2 = {} (the rotary frequencies it splits)",
                             p.contains("mrope_section") ? "" : "(absent: the rotary class's default) ", sum,
                             half_dim));
  }
  return out;
}

// transformers 5's RotaryEmbeddingConfigMixin: rope_scaling (when non-empty)
// or rope_parameters; rope_theta from there, else the top-level field.
// `mrope_half_dim` > 0 (Qwen2.5-VL, head_dim / 2): rope_type "mrope" is
// "default" (Qwen2_5_VLTextConfig's conversion) and mrope_section is read.
RopeParams parse_rope(const json& t, const std::string& path, double default_theta, int64_t max_positions,
                      int64_t mrope_half_dim) {
  const json* scaling = object_field(t, "rope_scaling", path);
  const bool use_scaling = scaling && !scaling->empty();
  const json* obj = use_scaling ? scaling : object_field(t, "rope_parameters", path);
  const json none = json::object();
  const json& p = obj ? *obj : none;
  const std::string where = obj ? fmt::format("{} ({})", path, use_scaling ? "rope_scaling" : "rope_parameters") : path;
  for (const char* per_layer : {"full_attention", "sliding_attention"}) {
    if (p.contains(per_layer)) {
      throw ConfigError(fmt::format("{}: RoPE parameters per layer type are not supported", where));
    }
  }
  RopeParams r;
  r.theta = config_positive_number(p, "rope_theta", where,
                                   config_positive_number(t, "rope_theta", path, default_theta, 1e15), 1e15);
  r.type = config_string_or(p, "rope_type", where, config_string_or(p, "type", where, "default"));
  if (mrope_half_dim > 0) {
    if (r.type == "mrope") r.type = "default";
    r.mrope_section = parse_mrope_section(p, where, mrope_half_dim);
  }
  const double partial =
      config_number_or(p, "partial_rotary_factor", where, config_number_or(t, "partial_rotary_factor", path, 1.0));
  if (partial != 1.0) {
    throw ConfigError(fmt::format("{}: partial_rotary_factor {} is not supported (these models rotate the whole head)",
                                  where, partial));
  }
  // standardize_rope_params: a top-level original_max_position_embeddings wins, else
  // rope_parameters', else max_position_embeddings.
  auto original = [&] {
    if (config_int_or_null(t, "original_max_position_embeddings", path)) {
      return config_positive_required(t, "original_max_position_embeddings", path);
    }
    return config_positive(p, "original_max_position_embeddings", where, max_positions);
  };
  if (r.type == "default") return r;
  if (r.type == "linear" || r.type == "llama3") {
    if (!p.contains("factor")) throw CheckpointError(fmt::format("{}: rope_type '{}' needs 'factor'", where, r.type));
    r.factor = config_positive_number(p, "factor", where, 1.0, 1e6);
    if (r.type == "llama3") {
      r.low_freq_factor = config_positive_number(p, "low_freq_factor", where, r.low_freq_factor, 1e6);
      r.high_freq_factor = config_positive_number(p, "high_freq_factor", where, r.high_freq_factor, 1e6);
      if (r.low_freq_factor == r.high_freq_factor) {
        throw CheckpointError(fmt::format("{}: low_freq_factor and high_freq_factor must differ", where));
      }
      r.original_max_position_embeddings = original();
    }
    return r;
  }
  if (r.type == "yarn") {
    r.factor = optional_positive(p, "factor", where, 1e6);
    r.attention_factor = optional_positive(p, "attention_factor", where, 1e6);
    r.mscale = optional_positive(p, "mscale", where, 1e6);
    r.mscale_all_dim = optional_positive(p, "mscale_all_dim", where, 1e6);
    r.beta_fast = config_positive_number(p, "beta_fast", where, 32.0, 1e6);
    r.beta_slow = config_positive_number(p, "beta_slow", where, 1.0, 1e6);
    r.truncate = config_bool_or(p, "truncate", where, true);
    r.original_max_position_embeddings = original();
    return r;
  }
  throw ConfigError(fmt::format("{}: rope_type '{}' is not supported (tprun runs default, linear, llama3, yarn)", where,
                                r.type));
}

// What a text config omits, per config class.
struct TextDefaults {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads;
  std::optional<int64_t> head_dim;  // nullopt: hidden_size / num_attention_heads
  int64_t max_positions;
  double eps, theta;
  // Qwen2.5-VL: head_dim is hidden_size / num_attention_heads (its attention
  // ignores a head_dim field), and the RoPE is multimodal.
  bool qwen2_5_vl = false;
};

// `layers`: where the checkpoint keeps the decoder layers (alternative layouts).
void parse_text(const json& t, const std::string& path, const TextDefaults& d, DecoderConfig& f,
                const TensorCensus* census, const std::vector<std::string>& layers) {
  f.layers = config_block_count(t, "num_hidden_layers", path, d.layers, census, layers, 1);
  f.vocab_size = config_positive(t, "vocab_size", path, d.vocab, kMaxConfigVocab);
  f.hidden_size = config_positive(t, "hidden_size", path, d.hidden, kMaxConfigWidth);
  f.intermediate_size = config_positive(t, "intermediate_size", path, d.intermediate, 1 << 22);
  f.heads = config_positive(t, "num_attention_heads", path, d.heads, kMaxConfigHeads);
  f.kv_heads = nullable_positive(t, "num_key_value_heads", path, d.kv_heads, kMaxConfigHeads).value_or(f.heads);
  if (f.heads % f.kv_heads != 0) {
    throw CheckpointError(fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path,
                                      f.heads, f.kv_heads));
  }
  std::optional<int64_t> head_dim = d.head_dim;
  if (config_int_or_null(t, "head_dim", path)) head_dim = config_positive_required(t, "head_dim", path, 4096);
  f.head_dim = head_dim.value_or(f.hidden_size / f.heads);
  if (d.qwen2_5_vl && f.head_dim * f.heads != f.hidden_size) {
    throw CheckpointError(fmt::format("{}: hidden_size {} is not num_attention_heads {} x head_dim {} (Qwen2.5-VL's "
                                      "attention takes head_dim = hidden_size / num_attention_heads)",
                                      path, f.hidden_size, f.heads, f.head_dim));
  }
  if (f.head_dim < 2 || f.head_dim % 2 != 0) {
    throw CheckpointError(fmt::format("{}: head_dim {} must be even for RoPE", path, f.head_dim));
  }
  (void)config_product(path, {{"num_attention_heads", f.heads}, {"head_dim", f.head_dim}}, kMaxConfigWidth);
  f.max_position_embeddings = config_positive(t, "max_position_embeddings", path, d.max_positions, kMaxConfigVocab);
  f.rms_norm_eps = config_positive_number(t, "rms_norm_eps", path, d.eps, 1.0);
  f.act = config_string_or(t, "hidden_act", path, "silu");
  if (!known_activation(f.act)) {
    throw CheckpointError(fmt::format("{}: field 'hidden_act' = '{}' is not supported", path, f.act));
  }
  f.rope = parse_rope(t, path, d.theta, f.max_position_embeddings, d.qwen2_5_vl ? f.head_dim / 2 : 0);
}

// Qwen2Config-style sliding windows (Qwen3, Qwen2.5-VL's text model):
// sliding_window only with use_sliding_window; layer_types, else sliding from
// max_window_layers (default `max_window_default`) on.
void parse_windows(const json& c, const std::string& path, int64_t max_window_default, DecoderConfig& f) {
  const std::optional<int64_t> window = config_bool_or(c, "use_sliding_window", path, false)
                                            ? nullable_positive(c, "sliding_window", path, 4096, kMaxConfigDim)
                                            : std::nullopt;
  const int64_t max_window_layers = config_int_or_null(c, "max_window_layers", path).value_or(max_window_default);
  f.window.assign(static_cast<size_t>(f.layers), 0);
  const bool listed = c.contains("layer_types") && !c["layer_types"].is_null();
  if (listed && (!c["layer_types"].is_array() || c["layer_types"].size() != static_cast<size_t>(f.layers))) {
    throw CheckpointError(fmt::format("{}: field 'layer_types' must list one type per layer ({})", path, f.layers));
  }
  for (int64_t i = 0; i < f.layers; ++i) {
    bool sliding = window.has_value() && i >= max_window_layers;
    if (listed) {
      const json& type = c["layer_types"][static_cast<size_t>(i)];
      if (!type.is_string() || (type != "full_attention" && type != "sliding_attention")) {
        throw CheckpointError(fmt::format("{}: layer_types[{}] = {} is not full_attention or sliding_attention", path,
                                          i, type.dump()));
      }
      sliding = type == "sliding_attention";
    }
    if (sliding && !window) {
      throw CheckpointError(fmt::format("{}: layer {} is sliding_attention but sliding_window is not set", path, i));
    }
    f.window[static_cast<size_t>(i)] = sliding ? *window : 0;
  }
}

void parse_qwen3(const json& c, const std::string& path, DecoderConfig& f, const TensorCensus* census) {
  f.family = DecoderFamily::Qwen3;
  f.qk_norm = true;
  // Qwen3Config's defaults (Qwen3-8B-like).
  parse_text(c, path, {151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, 10000.0}, f, census, {"model.layers"});
  f.attention_bias = config_bool_or(c, "attention_bias", path, false);
  f.o_proj_bias = f.attention_bias;
  parse_windows(c, path, 28, f);
}

void parse_mistral3(const json& c, const std::string& path, DecoderConfig& f, const TensorCensus* census) {
  f.family = DecoderFamily::Mistral3;
  // save_pretrained's layout or transformers' module names (detect_layout).
  const std::vector<std::string> layers = {"language_model.model.layers", "model.language_model.layers"};
  f.qk_norm = false;
  f.attention_bias = false;  // MistralAttention's projections never have biases
  std::optional<int64_t> window;
  if (const json* t = object_field(c, "text_config", path)) {
    const std::string tpath = path + " (text_config)";
    const std::string type = config_string_or(*t, "model_type", tpath, "mistral");
    if (type != "mistral") {
      throw ConfigError(fmt::format("{}: text_config model_type '{}' is not supported (tprun runs 'mistral')", tpath,
                                    type));
    }
    // MistralConfig's defaults.
    parse_text(*t, tpath, {32000, 4096, 14336, 32, 32, 8, std::nullopt, 131072, 1e-6, 10000.0}, f, census, layers);
    window = nullable_positive(*t, "sliding_window", tpath, 4096, kMaxConfigDim);
  } else {
    // Mistral3Config without text_config: Mistral-Small-3.1's language model, no sliding window.
    parse_text(json::object(), path, {131072, 5120, 32768, 40, 32, 8, 128, 131072, 1e-5, 1e9}, f, census, layers);
  }
  f.window.assign(static_cast<size_t>(f.layers), window.value_or(0));

  Mistral3VisionConfig& v = f.vision;
  if (const json* vc = object_field(c, "vision_config", path)) {
    const std::string vpath = path + " (vision_config)";
    const std::string type = config_string_or(*vc, "model_type", vpath, "pixtral");
    if (type != "pixtral") {
      throw ConfigError(fmt::format("{}: vision_config model_type '{}': tprun knows the tensor names of 'pixtral' only",
                                    vpath, type));
    }
    v.hidden = config_positive(*vc, "hidden_size", vpath, 1024, kMaxConfigWidth);
    v.intermediate = config_positive(*vc, "intermediate_size", vpath, 4096, 1 << 22);
    // The vision tower is never run (its tensors are optional): capped, not counted.
    v.layers = config_positive(*vc, "num_hidden_layers", vpath, 24, kMaxConfigLayers);
    v.channels = config_positive(*vc, "num_channels", vpath, 3, 64);
    if (vc->contains("patch_size") && (*vc)["patch_size"].is_array()) {
      const auto patch = config_int_list_or(*vc, "patch_size", vpath, {}, 2, 4096);
      if (patch.size() != 2) throw CheckpointError(fmt::format("{}: field 'patch_size' must be 1 or 2 integers", vpath));
      v.patch_h = patch[0];
      v.patch_w = patch[1];
    } else {
      v.patch_h = v.patch_w = config_positive(*vc, "patch_size", vpath, 16, 4096);
    }
  }
  if (c.contains("vision_feature_layer") && c["vision_feature_layer"].is_array()) {
    v.feature_layers = static_cast<int64_t>(c["vision_feature_layer"].size());
    if (v.feature_layers < 1 || v.feature_layers > 64) {
      throw CheckpointError(fmt::format("{}: field 'vision_feature_layer' must list 1 to 64 layers", path));
    }
  }
  v.spatial_merge = config_positive(c, "spatial_merge_size", path, 2, 64);
  v.projector_bias = config_bool_or(c, "multimodal_projector_bias", path, false);
}

// Qwen2_5_VLConfig: the text model from text_config when it is an object
// (what transformers 5 writes; top-level text fields are then ignored, as
// transformers ignores them), else from the top-level fields (the hub's
// transformers 4.x file, rope_scaling {"type": "mrope", ...} among them).
void parse_qwen2_5_vl(const json& c, const std::string& path, DecoderConfig& f, const TensorCensus* census) {
  f.family = DecoderFamily::Qwen2_5_VL;
  f.qk_norm = false;
  f.attention_bias = true;  // Qwen2_5_VLAttention: q/k/v with biases, o_proj without
  f.o_proj_bias = false;
  const json* nested = object_field(c, "text_config", path);
  const json& t = nested ? *nested : c;
  const std::string tpath = nested ? path + " (text_config)" : path;
  // Qwen2_5_VLTextConfig's defaults (the 72B's shapes); rms_norm_eps 1e-5, rope_theta 1e6.
  TextDefaults d{152064, 8192, 29568, 80, 64, 8, std::nullopt, 32768, 1e-5, 1e6};
  d.qwen2_5_vl = true;
  parse_text(t, tpath, d, f, census, {"model.layers", "model.language_model.layers"});
  parse_windows(t, tpath, 80, f);
  // Qwen2_5_VLConfig: untied unless the top level or (pre-v5 files) text_config says tied.
  f.tie_word_embeddings = config_bool_or(c, "tie_word_embeddings", path, false) ||
                          (nested && config_bool_or(*nested, "tie_word_embeddings", tpath, false));

  Qwen2_5_VLVisionConfig& v = f.qwen_vision;
  if (const json* vc = object_field(c, "vision_config", path)) {
    // Shapes of tensors never read: capped, not counted against the checkpoint.
    const std::string vpath = path + " (vision_config)";
    v.depth = config_positive(*vc, "depth", vpath, v.depth, kMaxConfigLayers);
    v.hidden = config_positive(*vc, "hidden_size", vpath, v.hidden, kMaxConfigWidth);
    v.intermediate = config_positive(*vc, "intermediate_size", vpath, v.intermediate, 1 << 22);
    v.channels = config_positive(*vc, "in_channels", vpath, v.channels, 64);
    v.patch = config_positive(*vc, "patch_size", vpath, v.patch, 4096);
    v.temporal_patch = config_positive(*vc, "temporal_patch_size", vpath, v.temporal_patch, 64);
    v.spatial_merge = config_positive(*vc, "spatial_merge_size", vpath, v.spatial_merge, 64);
    v.out_hidden = config_positive(*vc, "out_hidden_size", vpath, v.out_hidden, kMaxConfigWidth);
    (void)config_product(vpath, {{"hidden_size", v.hidden}, {"spatial_merge_size", v.spatial_merge},
                                 {"spatial_merge_size", v.spatial_merge}},
                         kMaxConfigWidth);
  }
}

}  // namespace

std::string DecoderConfig::base_prefix() const {
  const bool saved = layout == NameLayout::Saved;
  switch (family) {
    case DecoderFamily::Qwen3:
      return "model.";
    case DecoderFamily::Mistral3:
      return saved ? "language_model.model." : "model.language_model.";
    case DecoderFamily::Qwen2_5_VL:
      return saved ? "model." : "model.language_model.";
  }
  return "model.";
}

DecoderConfig DecoderConfig::from_json(const json& c, const std::string& path, const TensorCensus* census) {
  if (!c.is_object()) throw CheckpointError(fmt::format("{}: config must be a JSON object", path));
  DecoderConfig f;
  f.cls = config_class(c);
  const std::string type = config_string_or(c, "model_type", path, "");
  if (f.cls.empty()) {
    f.cls = type == "qwen3" ? kQwen3 : type == "mistral3" ? kMistral3 : type == "qwen2_5_vl" ? kQwen2_5_VL : "";
  }
  if (f.cls == kQwen3 || f.cls == kMistral3) {
    if (f.cls == kQwen3) {
      parse_qwen3(c, path, f, census);
    } else {
      parse_mistral3(c, path, f, census);
    }
    // The top-level field decides whether save_pretrained writes lm_head
    // (Qwen3Config's default: untied; Mistral3Config's: tied).
    f.tie_word_embeddings = config_bool_or(c, "tie_word_embeddings", path, f.family == DecoderFamily::Mistral3);
  } else if (f.cls == kQwen2_5_VL) {
    parse_qwen2_5_vl(c, path, f, census);
  } else {
    throw ConfigError(fmt::format("{}: class '{}' is not a decoder text encoder tprun runs ({}, {}, {})", path,
                                  f.cls, kQwen3, kMistral3, kQwen2_5_VL));
  }
  return f;
}

}  // namespace tprun::models
