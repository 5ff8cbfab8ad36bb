// Qwen3ForCausalLM and the language models of Mistral3ForConditionalGeneration
// and Qwen2_5_VLForConditionalGeneration as text encoders: the table (both
// name layouts of the multimodal classes, their vision towers declared and
// never read), the layer filter for hidden_layers, loading and the forward
// (see decoder_text_encoder.h; the config is read in
// decoder_text_encoder_config.cpp, the layer computed in decoder_text_encoder_layers.cpp).
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

using nlohmann::json;

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
  const bool saved = c.layout == NameLayout::Saved;
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

// Qwen2.5-VL's vision tower (Qwen2_5_VisionTransformerPretrainedModel):
// declared, never read. Conv3d patch embedding without bias; per block two
// RMSNorms, a fused qkv and proj with biases, a SwiGLU MLP with biases; the
// patch merger (RMSNorm, then Linear -> GELU -> Linear on merge^2 patches).
void declare_qwen2_5_vl_vision(const DecoderConfig& c, ModelBuilder& b) {
  const Qwen2_5_VLVisionConfig& v = c.qwen_vision;
  const std::string tower = c.layout == NameLayout::Saved ? "visual." : "model.visual.";
  const int64_t h = v.hidden, merged = v.hidden * v.spatial_merge * v.spatial_merge;
  b.unused(tower + "patch_embed.proj.weight", {h, v.channels, v.temporal_patch, v.patch, v.patch}, TensorKind::Conv);
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    b.unused(name + ".weight", {out, in}, TensorKind::Linear);
    b.unused(name + ".bias", {out}, TensorKind::Bias);
  };
  for (int64_t i = 0; i < v.depth; ++i) {
    const std::string p = fmt::format("{}blocks.{}.", tower, i);
    b.unused(p + "norm1.weight", {h}, TensorKind::Norm);
    b.unused(p + "norm2.weight", {h}, TensorKind::Norm);
    linear(p + "attn.qkv", 3 * h, h);
    linear(p + "attn.proj", h, h);
    linear(p + "mlp.gate_proj", v.intermediate, h);
    linear(p + "mlp.up_proj", v.intermediate, h);
    linear(p + "mlp.down_proj", h, v.intermediate);
  }
  b.unused(tower + "merger.ln_q.weight", {h}, TensorKind::Norm);
  linear(tower + "merger.mlp.0", merged, merged);
  linear(tower + "merger.mlp.2", v.out_hidden, merged);
}

// Module order as the state_dict: (vision tower, projector,) the language
// model, lm_head.
void declare_decoder(const DecoderConfig& c, ModelBuilder& b, DecoderWeights& w) {
  b.tp_divides("num_attention_heads", c.heads);
  b.tp_divides("num_key_value_heads", c.kv_heads);
  if (c.family == DecoderFamily::Mistral3) declare_mistral3_vision(c, b);
  if (c.family == DecoderFamily::Qwen2_5_VL) declare_qwen2_5_vl_vision(c, b);
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
    l.o = b.linear(p + "self_attn.o_proj", hidden, c.q_dim(), row.with_bias(c.o_proj_bias));
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
  const bool saved_mistral3 = c.family == DecoderFamily::Mistral3 && c.layout == NameLayout::Saved;
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

NameLayout detect_layout(const checkpoint::WeightSource& source, const DecoderConfig& c) {
  DecoderConfig saved = c, in_memory = c;
  saved.layout = NameLayout::Saved;
  in_memory.layout = NameLayout::InMemory;
  const std::string a = saved.base_prefix() + "embed_tokens.weight";
  const std::string b = in_memory.base_prefix() + "embed_tokens.weight";
  if (source.contains(a)) return NameLayout::Saved;
  if (source.contains(b)) return NameLayout::InMemory;
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
  if (c.family != DecoderFamily::Qwen3) c.layout = detect_layout(source, c);
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
  m->lora_targets_ = built.lora_targets;
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
  const at::Tensor keep = attention_keep_mask(attention_mask, ids, c.cls);
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
TPRUN_REGISTER_MODEL_AS("Qwen2_5_VLForConditionalGeneration", DecoderTextEncoder, DecoderConfig);

}  // namespace tprun::models
