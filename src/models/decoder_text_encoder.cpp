// Qwen3ForCausalLM and Mistral3ForConditionalGeneration's language model as
// FLUX.2 text encoders: config, the table (both Mistral3 name layouts), the
// layer filter for hidden_layers, loading and the forward (see
// decoder_text_encoder.h; the layer itself is in decoder_text_encoder_layers.cpp).
#include "models/decoder_text_encoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/stack.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/decoder_text_encoder_layers.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_inputs.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/text_encoder_common.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

using nlohmann::json;

constexpr const char* kQwen3 = "Qwen3ForCausalLM";
constexpr const char* kMistral3 = "Mistral3ForConditionalGeneration";

// ---- config ----------------------------------------------------------------

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

// transformers 5's RotaryEmbeddingConfigMixin: rope_scaling (when non-empty)
// or rope_parameters; rope_theta from there, else the top-level field.
RopeParams parse_rope(const json& t, const std::string& path, double default_theta, int64_t max_positions) {
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
  f.rope = parse_rope(t, path, d.theta, f.max_position_embeddings);
}

void parse_qwen3(const json& c, const std::string& path, DecoderConfig& f, const TensorCensus* census) {
  f.family = DecoderFamily::Qwen3;
  f.qk_norm = true;
  // Qwen3Config's defaults (Qwen3-8B-like).
  parse_text(c, path, {151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, 10000.0}, f, census, {"model.layers"});
  f.attention_bias = config_bool_or(c, "attention_bias", path, false);
  // sliding_window only with use_sliding_window; layer_types, else sliding from max_window_layers on.
  const std::optional<int64_t> window = config_bool_or(c, "use_sliding_window", path, false)
                                            ? nullable_positive(c, "sliding_window", path, 4096, kMaxConfigDim)
                                            : std::nullopt;
  const int64_t max_window_layers = config_int_or_null(c, "max_window_layers", path).value_or(28);
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

}  // namespace

std::string DecoderConfig::base_prefix() const {
  if (family == DecoderFamily::Qwen3) return "model.";
  return layout == Mistral3Layout::Saved ? "language_model.model." : "model.language_model.";
}

DecoderConfig DecoderConfig::from_json(const json& c, const std::string& path, const TensorCensus* census) {
  if (!c.is_object()) throw CheckpointError(fmt::format("{}: config must be a JSON object", path));
  DecoderConfig f;
  f.cls = config_class(c);
  const std::string type = config_string_or(c, "model_type", path, "");
  if (f.cls.empty()) f.cls = type == "qwen3" ? kQwen3 : type == "mistral3" ? kMistral3 : "";
  if (f.cls == kQwen3) {
    parse_qwen3(c, path, f, census);
  } else if (f.cls == kMistral3) {
    parse_mistral3(c, path, f, census);
  } else {
    throw ConfigError(fmt::format("{}: class '{}' is not a decoder text encoder tprun runs ({}, {})", path, f.cls,
                                  kQwen3, kMistral3));
  }
  // The top-level field decides whether save_pretrained writes lm_head
  // (Qwen3Config's default: untied; Mistral3Config's: tied).
  f.tie_word_embeddings = config_bool_or(c, "tie_word_embeddings", path, f.family == DecoderFamily::Mistral3);
  return f;
}

// ---- table -----------------------------------------------------------------

struct DecoderWeights {
  parallel::Weight embed, norm;
  std::vector<DecoderLayerWeights> layers;  // the layers run
  at::Tensor inv_freq;                      // fp32, CPU
  double rope_scaling = 1.0;
};

namespace {

// Pixtral vision tower and multi-modal projector: declared, never read.
void declare_mistral3_vision(const DecoderConfig& c, ModelBuilder& b) {
  const Mistral3VisionConfig& v = c.vision;
  const bool saved = c.layout == Mistral3Layout::Saved;
  const std::string tower = saved ? "vision_tower." : "model.vision_tower.";
  const std::string proj = saved ? "multi_modal_projector." : "model.multi_modal_projector.";
  b.unused(tower + "patch_conv.weight", {v.hidden, v.channels, v.patch_h, v.patch_w}, TensorKind::Conv);
  b.unused(tower + "ln_pre.weight", {v.hidden}, TensorKind::Norm);
  for (int64_t i = 0; i < v.layers; ++i) {
    const std::string p = fmt::format("{}transformer.layers.{}.", tower, i);
    b.unused(p + "attention_norm.weight", {v.hidden}, TensorKind::Norm);
    b.unused(p + "feed_forward.gate_proj.weight", {v.intermediate, v.hidden}, TensorKind::Linear);
    b.unused(p + "feed_forward.up_proj.weight", {v.intermediate, v.hidden}, TensorKind::Linear);
    b.unused(p + "feed_forward.down_proj.weight", {v.hidden, v.intermediate}, TensorKind::Linear);
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      b.unused(fmt::format("{}attention.{}.weight", p, n), {v.hidden, v.hidden}, TensorKind::Linear);
    }
    b.unused(p + "ffn_norm.weight", {v.hidden}, TensorKind::Norm);
  }
  const int64_t merge = v.spatial_merge * v.spatial_merge;
  b.unused(proj + "norm.weight", {v.hidden}, TensorKind::Norm);
  b.unused(proj + "patch_merger.merging_layer.weight", {v.hidden, v.hidden * merge}, TensorKind::Linear);
  b.unused(proj + "linear_1.weight", {c.hidden_size, v.hidden * v.feature_layers}, TensorKind::Linear);
  if (v.projector_bias) b.unused(proj + "linear_1.bias", {c.hidden_size}, TensorKind::Bias);
  b.unused(proj + "linear_2.weight", {c.hidden_size, c.hidden_size}, TensorKind::Linear);
  if (v.projector_bias) b.unused(proj + "linear_2.bias", {c.hidden_size}, TensorKind::Bias);
}

// Module order as the state_dict: (vision tower, projector,) the language
// model, lm_head.
void declare_decoder(const DecoderConfig& c, ModelBuilder& b, DecoderWeights& w) {
  b.tp_divides("num_attention_heads", c.heads);
  b.tp_divides("num_key_value_heads", c.kv_heads);
  if (c.family == DecoderFamily::Mistral3) declare_mistral3_vision(c, b);
  const std::string base = c.base_prefix();
  const int64_t hidden = c.hidden_size;
  const LinearDecl col = LinearDecl::colwise(), row = LinearDecl::rowwise();
  w.embed = b.tensor(base + "embed_tokens.weight", {c.vocab_size, hidden}, TensorKind::Embedding);
  w.layers.clear();
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("{}layers.{}.", base, i);
    DecoderLayerWeights l;
    l.q = b.linear(p + "self_attn.q_proj", c.q_dim(), hidden, col.with_bias(c.attention_bias));
    l.k = b.linear(p + "self_attn.k_proj", c.kv_dim(), hidden, col.with_bias(c.attention_bias));
    l.v = b.linear(p + "self_attn.v_proj", c.kv_dim(), hidden, col.with_bias(c.attention_bias));
    l.o = b.linear(p + "self_attn.o_proj", hidden, c.q_dim(), row.with_bias(c.attention_bias));
    if (c.qk_norm) {
      l.q_norm = b.tensor(p + "self_attn.q_norm.weight", {c.head_dim}, TensorKind::Norm);
      l.k_norm = b.tensor(p + "self_attn.k_norm.weight", {c.head_dim}, TensorKind::Norm);
    }
    l.gate = b.linear(p + "mlp.gate_proj", c.intermediate_size, hidden, col);
    l.up = b.linear(p + "mlp.up_proj", c.intermediate_size, hidden, col);
    l.down = b.linear(p + "mlp.down_proj", hidden, c.intermediate_size, row);
    l.input_norm = b.tensor(p + "input_layernorm.weight", {hidden}, TensorKind::Norm);
    l.post_norm = b.tensor(p + "post_attention_layernorm.weight", {hidden}, TensorKind::Norm);
    w.layers.push_back(std::move(l));
  }
  w.norm = b.tensor(base + "norm.weight", {hidden}, TensorKind::Norm);
  // Never read; save_pretrained writes it only when it is not tied to embed_tokens.
  const bool saved_mistral3 = c.family == DecoderFamily::Mistral3 && c.layout == Mistral3Layout::Saved;
  b.unused(saved_mistral3 ? "language_model.lm_head.weight" : "lm_head.weight", {c.vocab_size, hidden},
           TensorKind::Linear, /*saved=*/!c.tie_word_embeddings);
}

// The layers the hidden states asked for need: the largest index (each in
// [0, layers]); all of them when none is asked for.
int64_t layers_needed(const DecoderConfig& c, const std::vector<int64_t>& hidden_layers) {
  int64_t need = hidden_layers.empty() ? c.layers : 0;
  for (int64_t k : hidden_layers) {
    if (k < 0 || k > c.layers) {
      throw ConfigError(fmt::format("{}: hidden layer {} is outside [0, {}] (hidden_states has num_hidden_layers + 1 "
                                    "entries: 0 = embeddings, {} = after the final norm)",
                                    c.cls, k, c.layers, c.layers),
                        true);
    }
    need = std::max(need, k);
  }
  return need;
}

// Loads the embeddings, layers [0, run) and the final norm when run == layers.
LoadFilter layer_filter(const DecoderConfig& c, int64_t run) {
  if (run == c.layers) return {};
  const std::string layers = c.base_prefix() + "layers.", norm = c.base_prefix() + "norm.weight";
  return [layers, norm, run](const std::string& name) {
    if (name == norm) return false;
    if (name.compare(0, layers.size(), layers) != 0) return true;
    const size_t end = name.find('.', layers.size());
    return std::stoll(name.substr(layers.size(), end - layers.size())) < run;
  };
}

Mistral3Layout detect_layout(const checkpoint::WeightSource& source, const DecoderConfig& c) {
  DecoderConfig saved = c, in_memory = c;
  saved.layout = Mistral3Layout::Saved;
  in_memory.layout = Mistral3Layout::InMemory;
  const std::string a = saved.base_prefix() + "embed_tokens.weight";
  const std::string b = in_memory.base_prefix() + "embed_tokens.weight";
  if (source.contains(a)) return Mistral3Layout::Saved;
  if (source.contains(b)) return Mistral3Layout::InMemory;
  throw CheckpointError(fmt::format("{}: {} checkpoint holds neither '{}' (the layout save_pretrained writes) nor '{}' "
                                    "(transformers' module names)",
                                    source.path(), c.cls, a, b),
                        true);
}

}  // namespace

ModelTable DecoderTextEncoder::table_for(const DecoderConfig& config, const ModelOptions& options) {
  const int64_t run = layers_needed(config, options.hidden_layers);
  DecoderWeights w;
  ModelTable table = record_table(config.cls, [&](ModelBuilder& b) { declare_decoder(config, b, w); });
  // What a load with these hidden_layers never reads (the layers after the cut, the final norm).
  if (const LoadFilter wanted = layer_filter(config, run)) {
    for (auto& t : table.tensors) t.optional = t.optional || !wanted(t.name);
  }
  return table;
}

std::unique_ptr<DecoderTextEncoder> DecoderTextEncoder::load(checkpoint::WeightSource& source, const json& config,
                                                             const std::string& config_path,
                                                             const parallel::TpContext& tp,
                                                             const ModelOptions& options) {
  auto m = std::make_unique<DecoderTextEncoder>();
  DecoderConfig& c = m->config_;
  // A load cut at hidden_layers may come from a checkpoint whose later layers
  // were deleted: the layer count is then only capped here, and the layers
  // the cut keeps are checked by the validation like every wanted tensor.
  const TensorCensus census = census_of(source);
  c = DecoderConfig::from_json(config, config_path, options.hidden_layers.empty() ? &census : nullptr);
  // Names only (headers): the table is recorded in the layout the checkpoint has.
  if (c.family == DecoderFamily::Mistral3) c.layout = detect_layout(source, c);
  m->hidden_layers_ = options.hidden_layers;
  m->layers_run_ = layers_needed(c, options.hidden_layers);
  m->attention_chunk_ = nn::checked_attention_chunk(options.memory.attention_chunk);
  m->final_norm_ = m->layers_run_ == c.layers;
  m->tp_ = tp;
  auto w = std::make_shared<DecoderWeights>();
  BuildOptions build = build_options(options);
  build.wanted = layer_filter(c, m->layers_run_);
  BuiltModel built = build_model(c.cls, source, tp, build, [&](ModelBuilder& b) { declare_decoder(c, b, *w); });
  w->layers.resize(static_cast<size_t>(m->layers_run_));
  std::tie(w->inv_freq, w->rope_scaling) =
      rope_inverse_frequencies(c.rope, c.head_dim, c.max_position_embeddings);
  m->table_ = std::move(built.table);
  m->bytes_loaded_ = built.bytes_read;
  m->bytes_stored_ = built.bytes_stored;
  m->w_ = std::move(w);
  nn::log_sdpa_attention(c.cls, options.device, checkpoint::parse_compute_dtype(options.dtype, "dtype"),
                         c.heads / tp.size, c.head_dim, true, m->attention_chunk_);
  return m;
}

int64_t DecoderTextEncoder::all_reduces_per_forward() const { return tp_.size == 1 ? 0 : 2 * layers_run_; }

std::string DecoderTextEncoder::primary_output() const {
  return hidden_layers_.empty() ? "last_hidden_state" : "prompt_embeds";
}

// ---- forward ---------------------------------------------------------------

namespace {

// attention_mask [B, S] of 0/1 (any integer, bool or floating type) -> bool;
// all ones when undefined.
at::Tensor keep_mask(const at::Tensor& mask, const at::Tensor& ids, const std::string& model) {
  if (!mask.defined()) return at::ones(ids.sizes(), ids.options().dtype(at::kBool));
  if (mask.dim() != 2 || mask.size(0) != ids.size(0) || mask.size(1) != ids.size(1)) {
    throw RequestError(fmt::format("{}: attention_mask has shape [{}] but input_ids is [{}, {}]", model,
                                   fmt::join(mask.sizes(), ", "), ids.size(0), ids.size(1)),
                       true);
  }
  if (at::isComplexType(mask.scalar_type())) {
    throw RequestError(fmt::format("{}: attention_mask must be 0/1 integers", model), true);
  }
  const at::Tensor m = mask.to(ids.device());
  if (!m.eq(0).logical_or(m.eq(1)).all().item<bool>()) {
    throw RequestError(fmt::format("{}: attention_mask must hold only 0 and 1", model), true);
  }
  return m.ne(0);
}

// stack(states, dim=1).permute(0, 2, 1, 3).reshape(B, S, n * hidden)
at::Tensor stack_states(const std::vector<at::Tensor>& states) {
  const at::Tensor s = at::stack(states, 1);
  return s.permute({0, 2, 1, 3}).reshape({s.size(0), s.size(2), s.size(1) * s.size(3)});
}

}  // namespace

std::vector<at::Tensor> DecoderTextEncoder::hidden_states(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                          Trace* trace) const {
  const DecoderWeights& w = *w_;
  const DecoderConfig& c = config_;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  const at::Tensor embed = w.embed.get();
  const at::Tensor ids = checked_input_ids(input_ids, c.vocab_size, c.cls, true).to(embed.device());
  const at::Tensor keep = keep_mask(attention_mask, ids, c.cls);
  const int64_t seq = ids.size(1);
  const std::vector<int64_t> wanted = hidden_layers_.empty() ? std::vector<int64_t>{c.layers} : hidden_layers_;
  std::map<int64_t, at::Tensor> kept;  // the hidden states asked for, by index
  auto note_state = [&](int64_t k, const at::Tensor& h) {
    record(fmt::format("hidden_states.{}", k), h);
    if (std::find(wanted.begin(), wanted.end(), k) != wanted.end()) kept[k] = h;
  };

  at::Tensor h = at::embedding(embed, ids);
  note_state(0, h);
  const auto [cos, sin] = rope_cos_sin(w.inv_freq, w.rope_scaling, seq, h);
  std::map<int64_t, at::Tensor> masks;  // by sliding window (0: full)
  DecoderLayerContext ctx;
  ctx.head_dim = c.head_dim;
  ctx.groups = c.heads / c.kv_heads;
  ctx.eps = c.rms_norm_eps;
  ctx.act = c.act;
  ctx.cos = &cos;
  ctx.sin = &sin;
  ctx.attention_chunk = attention_chunk_;
  for (int64_t i = 0; i < layers_run_; ++i) {
    const int64_t window = c.window[static_cast<size_t>(i)];
    auto it = masks.find(window);
    if (it == masks.end()) it = masks.emplace(window, attention_visibility(keep, window)).first;
    ctx.mask = &it->second;
    at::Tensor attention;
    h = decoder_layer_forward(w.layers[static_cast<size_t>(i)], h, ctx, trace ? &attention : nullptr);
    record(fmt::format("layers.{}.attention", i), attention);
    if (i + 1 == c.layers) h = decoder_rms_norm(h, w.norm.get(), c.rms_norm_eps);  // hidden_states[-1] is normed
    note_state(i + 1, h);
  }
  std::vector<at::Tensor> out;
  for (int64_t k : wanted) out.push_back(kept.at(k));
  return out;
}

at::Tensor DecoderTextEncoder::stacked_hidden_states(const at::Tensor& input_ids,
                                                     const at::Tensor& attention_mask) const {
  return stack_states(hidden_states(input_ids, attention_mask));
}

TensorMap DecoderTextEncoder::forward(const TensorMap& inputs, Trace* trace) const {
  const at::Tensor ids = input(inputs, "input_ids", 2);
  const at::Tensor mask = has_input(inputs, "attention_mask") ? inputs.at("attention_mask") : at::Tensor();
  std::vector<at::Tensor> states = hidden_states(ids, mask, trace);
  if (hidden_layers_.empty()) return {{"last_hidden_state", states[0]}};
  TensorMap out;
  for (size_t j = 0; j < states.size(); ++j) out[fmt::format("hidden_states.{}", hidden_layers_[j])] = states[j];
  out["prompt_embeds"] = stack_states(states);
  return out;
}

TensorMap DecoderTextEncoder::example_inputs(uint64_t seed) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  at::Tensor mask = at::ones({2, 16}, i64);
  mask[1].narrow(0, 11, 5).fill_(0);  // the second prompt right-padded to 16
  return {{"input_ids", at::randint(config_.vocab_size, {2, 16}, gen, i64)}, {"attention_mask", mask}};
}

TPRUN_REGISTER_MODEL_AS("Qwen3ForCausalLM", DecoderTextEncoder, DecoderConfig);
TPRUN_REGISTER_MODEL_AS("Mistral3ForConditionalGeneration", DecoderTextEncoder, DecoderConfig);

}  // namespace tprun::models
