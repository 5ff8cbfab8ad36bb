// CLIPTextModel: config, declaration, loading, forward.
#include "models/clip_text_model.h"

#include <cmath>
#include <limits>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/full.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/softmax.h>
#include <fmt/format.h>

#include "checkpoint/weight_source.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/text_encoder_common.h"
#include "parallel/parallel_linear.h"
#include "runtime/error.h"

namespace tprun::models {

// ---- config ---------------------------------------------------------------

ClipTextConfig ClipTextConfig::from_json(const nlohmann::json& c, const std::string& path,
                                         const TensorCensus* census) {
  ClipTextConfig f;
  f.layers = config_block_count(c, "num_hidden_layers", path, f.layers, census, {"text_model.encoder.layers", "encoder.layers"},
                                1);
  auto get = [&](const char* field, int64_t& v, int64_t max) { v = config_positive(c, field, path, v, max); };
  get("vocab_size", f.vocab_size, kMaxConfigVocab);
  get("hidden_size", f.hidden_size, kMaxConfigWidth);
  get("intermediate_size", f.intermediate_size, kMaxConfigWidth);
  get("num_attention_heads", f.heads, kMaxConfigHeads);
  get("max_position_embeddings", f.max_positions, kMaxConfigVocab);
  if (f.hidden_size % f.heads != 0) {
    throw CheckpointError(fmt::format("{}: hidden_size {} is not a multiple of num_attention_heads {}", path,
                                      f.hidden_size, f.heads));
  }
  f.hidden_act = config_string_or(c, "hidden_act", path, f.hidden_act);
  if (!known_activation(f.hidden_act)) {
    throw CheckpointError(fmt::format("{}: field 'hidden_act' = '{}' is not supported", path, f.hidden_act));
  }
  f.layer_norm_eps = config_number_or(c, "layer_norm_eps", path, f.layer_norm_eps);
  f.eos_token_id = config_int_or_null(c, "eos_token_id", path).value_or(f.eos_token_id);
  const std::string type = config_string_or(c, "model_type", path, "clip_text_model");
  if (type != "clip_text_model") {
    throw CheckpointError(fmt::format("{}: model_type '{}' is not a CLIP text model (expected 'clip_text_model')",
                                      path, type));
  }
  return f;
}

// ---- weights --------------------------------------------------------------

struct ClipLayerWeights {
  Affine ln1, ln2;
  parallel::ParallelLinear q, k, v, out, fc1, fc2;
};

struct ClipTextWeights {
  parallel::Weight token, position;  // [V, H], [P, H]
  std::vector<ClipLayerWeights> layers;
  Affine final_ln;
  int64_t attention_chunk = 0;  // MemoryOptions::attention_chunk (nn::over_query_chunks; 0 = all at once)
};

namespace {

constexpr const char* kHubPrefix = "text_model.";

// Every tensor under `prefix` ("text_model." or ""), in state_dict order, all replicated.
ClipTextWeights declare_clip(const ClipTextConfig& c, ModelBuilder& b, const std::string& prefix = kHubPrefix) {
  const int64_t h = c.hidden_size;
  const LinearDecl biased = LinearDecl::replicated().with_bias();
  ClipTextWeights w;
  w.token = b.tensor(prefix + "embeddings.token_embedding.weight", {c.vocab_size, h}, TensorKind::Embedding);
  w.position = b.tensor(prefix + "embeddings.position_embedding.weight", {c.max_positions, h},
                        TensorKind::Embedding);
  // A non-persistent buffer in transformers 5 (older checkpoints kept it).
  b.unused(prefix + "embeddings.position_ids", {1, c.max_positions}, TensorKind::Buffer, /*saved=*/false);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = prefix + fmt::format("encoder.layers.{}.", i);
    ClipLayerWeights l;
    l.k = b.linear(p + "self_attn.k_proj", h, h, biased);
    l.v = b.linear(p + "self_attn.v_proj", h, h, biased);
    l.q = b.linear(p + "self_attn.q_proj", h, h, biased);
    l.out = b.linear(p + "self_attn.out_proj", h, h, biased);
    l.ln1 = b.norm(p + "layer_norm1", h);
    l.fc1 = b.linear(p + "mlp.fc1", c.intermediate_size, h, biased);
    l.fc2 = b.linear(p + "mlp.fc2", h, c.intermediate_size, biased);
    l.ln2 = b.norm(p + "layer_norm2", h);
    w.layers.push_back(std::move(l));
  }
  w.final_ln = b.norm(prefix + "final_layer_norm", h);
  return w;
}

// The tensor-name prefix the checkpoint has: "text_model." (hub folders,
// transformers 4's save_pretrained) or "" (transformers 5's save_pretrained,
// which writes CLIPTextModel's state dict without it). Names only (headers).
std::string detect_prefix(const checkpoint::WeightSource& source) {
  const std::string probe = "embeddings.token_embedding.weight";
  if (source.contains(std::string(kHubPrefix) + probe)) return kHubPrefix;
  if (source.contains(probe)) return "";
  throw CheckpointError(fmt::format("{}: CLIPTextModel checkpoint holds neither '{}{}' (hub folders) nor '{}' (as "
                                    "transformers 5's save_pretrained writes it)",
                                    source.path(), kHubPrefix, probe, probe),
                        true);
}

}  // namespace

ModelTable ClipTextModel::table_for(const ClipTextConfig& config, const ModelOptions&) {
  return record_table(kClass, [&](ModelBuilder& b) { declare_clip(config, b); });
}

std::unique_ptr<ClipTextModel> ClipTextModel::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                   const std::string& config_path, const parallel::TpContext&,
                                                   const ModelOptions& options) {
  auto m = std::make_unique<ClipTextModel>();
  const TensorCensus census = census_of(source);
  m->config_ = ClipTextConfig::from_json(config, config_path, &census);
  const int64_t attention_chunk = nn::checked_attention_chunk(options.memory.attention_chunk);
  auto w = std::make_shared<ClipTextWeights>();
  const std::string prefix = detect_prefix(source);
  BuiltModel built = build_model(kClass, source, parallel::TpContext{}, build_options(options),
                                 [&](ModelBuilder& b) { *w = declare_clip(m->config_, b, prefix); });
  w->attention_chunk = attention_chunk;
  nn::log_eager_attention(kClass, attention_chunk);
  m->table_ = std::move(built.table);
  m->bytes_loaded_ = built.bytes_read;
  m->lora_targets_ = built.lora_targets;
  m->bytes_stored_ = built.bytes_stored;
  m->w_ = std::move(w);
  return m;
}

// ---- forward --------------------------------------------------------------

namespace {

// torch.finfo(dtype).min, the value transformers' causal mask uses.
double lowest_of(c10::ScalarType t) {
  switch (t) {
    case at::kHalf: return -65504.0;
    case at::kBFloat16: return -3.3895313892515355e38;
    case at::kDouble: return std::numeric_limits<double>::lowest();
    default: return std::numeric_limits<float>::lowest();
  }
}

}  // namespace

TensorMap ClipTextModel::encode(const at::Tensor& input_ids, Trace* trace) const {
  const ClipTextWeights& w = *w_;
  const ClipTextConfig& c = config_;
  at::Tensor ids = checked_input_ids(input_ids, c.vocab_size, "CLIPTextModel", true);
  const int64_t B = ids.size(0), S = ids.size(1), H = c.hidden_size, hd = c.head_dim();
  if (S > c.max_positions) {
    throw RequestError(fmt::format("CLIPTextModel: input_ids has {} positions, more than max_position_embeddings {}",
                                   S, c.max_positions),
                       true);
  }
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  const at::Tensor token = w.token.get();
  const auto opts = token.options();
  ids = ids.to(opts.device());

  at::Tensor h = at::embedding(token, ids) + w.position.get().narrow(0, 0, S).unsqueeze(0);
  record("hidden_states.0", h);
  // Causal mask: 0 on and below the diagonal, finfo.min above it.
  const at::Tensor mask = at::full({S, S}, lowest_of(opts.dtype().toScalarType()), opts).triu(1);
  const double scale = std::pow(static_cast<double>(hd), -0.5);
  auto split_heads = [&](const at::Tensor& y) { return y.view({B, S, -1, hd}).transpose(1, 2); };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const ClipLayerWeights& l = w.layers[i];
    at::Tensor x = at::layer_norm(h, {H}, l.ln1.weight.get(), l.ln1.bias.get(), c.layer_norm_eps);
    at::Tensor q = split_heads(l.q.forward(x)), k = split_heads(l.k.forward(x)), v = split_heads(l.v.forward(x));
    // With attention_chunk: the query rows (of q and of the mask) in chunks.
    at::Tensor attn = nn::over_query_chunks(S, w.attention_chunk, 2, [&](int64_t start, int64_t n) {
      const at::Tensor qc = n == S ? q : q.narrow(2, start, n);
      const at::Tensor mc = n == S ? mask : mask.narrow(0, start, n);
      at::Tensor scores = at::matmul(qc, k.transpose(-1, -2)) * scale + mc;
      at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
      return at::matmul(probs, v);
    });
    attn = attn.transpose(1, 2).reshape({B, S, H});
    h = h + l.out.forward(attn);
    x = at::layer_norm(h, {H}, l.ln2.weight.get(), l.ln2.bias.get(), c.layer_norm_eps);
    h = h + l.fc2.forward(hf_activation(l.fc1.forward(x), c.hidden_act));
    record(fmt::format("hidden_states.{}", i + 1), h);
  }
  at::Tensor last = at::layer_norm(h, {H}, w.final_ln.weight.get(), w.final_ln.bias.get(), c.layer_norm_eps);

  // Pooling (CLIPTextTransformer.forward): legacy eos_token_id 2 -> argmax of
  // the ids; otherwise the first position holding eos_token_id.
  at::Tensor ids_int = ids.to(at::kInt);
  at::Tensor pos = c.eos_token_id == 2 ? ids_int.argmax(-1) : ids_int.eq(c.eos_token_id).to(at::kInt).argmax(-1);
  at::Tensor pooled = last.gather(1, pos.to(at::kLong).view({B, 1, 1}).expand({B, 1, H})).squeeze(1);
  TensorMap out;
  out["last_hidden_state"] = last;
  out["pooler_output"] = pooled;
  return out;
}

TensorMap ClipTextModel::forward(const TensorMap& inputs, Trace* trace) const {
  auto it = inputs.find("input_ids");
  if (it == inputs.end()) throw RequestError("CLIPTextModel: input 'input_ids' is missing", true);
  return encode(it->second, trace);
}

TensorMap ClipTextModel::example_inputs(uint64_t seed) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t length = std::min<int64_t>(16, config_.max_positions);
  return {{"input_ids", at::randint(config_.vocab_size, {2, length}, gen, at::TensorOptions().dtype(at::kLong))}};
}

TPRUN_REGISTER_MODEL(ClipTextModel, ClipTextConfig);

}  // namespace tprun::models
