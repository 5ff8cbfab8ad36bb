// CLIPTextModel: config, loading, forward; and the pieces both text encoders
// share (activations by transformers name, input_ids checks).
#include "models/clip_text_model.h"

#include <cmath>
#include <limits>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>
#include <fmt/format.h>

#include "checkpoint/weight_source.h"
#include "models/flux_transformer.h"  // validate_tp_plan (generic over ModelTable)
#include "parallel/parallel_linear.h"
#include "runtime/error.h"

namespace tprun::models {

// ---- shared by the text encoders ------------------------------------------

bool known_activation(const std::string& n) {
  return n == "quick_gelu" || n == "gelu" || n == "gelu_new" || n == "gelu_pytorch_tanh" || n == "relu" ||
         n == "silu" || n == "swish";
}

at::Tensor hf_activation(const at::Tensor& x, const std::string& name) {
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);  // QuickGELUActivation
  if (name == "gelu") return at::gelu(x);                          // erf form
  if (name == "gelu_new") {                                        // NewGELUActivation, as written there
    return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
  }
  if (name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  if (name == "silu" || name == "swish") return at::silu(x);
  throw ConfigError(fmt::format("activation '{}' is not supported (known: quick_gelu, gelu, gelu_new, "
                                "gelu_pytorch_tanh, relu, silu)",
                                name));
}

at::Tensor checked_input_ids(const at::Tensor& ids, int64_t vocab_size, const std::string& model, bool all_ranks) {
  if (!ids.defined()) throw RequestError(fmt::format("{}: input_ids is missing", model), all_ranks);
  if (ids.dim() != 2) {
    throw RequestError(fmt::format("{}: input_ids must have 2 dims [batch, sequence], got {}", model, ids.dim()),
                       all_ranks);
  }
  if (!c10::isIntegralType(ids.scalar_type(), /*includeBool=*/false)) {
    throw RequestError(fmt::format("{}: input_ids must be an integer tensor, got {}", model,
                                   c10::toString(ids.scalar_type())),
                       all_ranks);
  }
  if (ids.size(0) < 1 || ids.size(1) < 1) {
    throw RequestError(fmt::format("{}: input_ids is empty ([{}, {}])", model, ids.size(0), ids.size(1)), all_ranks);
  }
  at::Tensor l = ids.to(at::kLong);
  const int64_t lo = l.min().item<int64_t>(), hi = l.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size) {
    throw RequestError(fmt::format("{}: input id {} is outside the vocabulary [0, {})", model, lo < 0 ? lo : hi,
                                   vocab_size),
                       all_ranks);
  }
  return l;
}

// ---- config ---------------------------------------------------------------

ClipTextConfig ClipTextConfig::from_json(const nlohmann::json& c, const std::string& path) {
  ClipTextConfig f;
  auto get = [&](const char* field, int64_t& v) { v = config_positive(c, field, path, v); };
  get("vocab_size", f.vocab_size);
  get("hidden_size", f.hidden_size);
  get("intermediate_size", f.intermediate_size);
  get("num_hidden_layers", f.layers);
  get("num_attention_heads", f.heads);
  get("max_position_embeddings", f.max_positions);
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
  at::Tensor ln1_w, ln1_b, ln2_w, ln2_b;
  parallel::ParallelLinear q, k, v, out, fc1, fc2;
};

struct ClipTextWeights {
  at::Tensor token, position;  // [V, H], [P, H]
  std::vector<ClipLayerWeights> layers;
  at::Tensor final_w, final_b;
};

ClipTextModel ClipTextModel::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                  const std::string& config_path, const TextEncoderLoadOptions& options) {
  ClipTextModel m;
  m.config_ = ClipTextConfig::from_json(config, config_path);
  const ModelTable table = clip_text_table(m.config_);
  validate_tp_plan(table, source, 1);  // every tensor present, shapes match; reads headers only

  checkpoint::LoadOptions lopts{options.mode, options.device, options.dtype};
  checkpoint::ShardLoader loader(source, lopts);
  const uint64_t before = loader.bytes_read();
  auto tensor = [&](const std::string& name) { return loader.load(name, table.request(name, 0, 1)); };
  auto linear = [&](const std::string& prefix) {
    return parallel::ParallelLinear::load(loader, prefix, table.request(prefix + ".weight", 0, 1), true,
                                          table.request(prefix + ".bias", 0, 1));
  };
  auto w = std::make_shared<ClipTextWeights>();
  w->token = tensor("text_model.embeddings.token_embedding.weight");
  w->position = tensor("text_model.embeddings.position_embedding.weight");
  for (int64_t i = 0; i < m.config_.layers; ++i) {
    const std::string p = fmt::format("text_model.encoder.layers.{}.", i);
    ClipLayerWeights l;
    l.q = linear(p + "self_attn.q_proj");
    l.k = linear(p + "self_attn.k_proj");
    l.v = linear(p + "self_attn.v_proj");
    l.out = linear(p + "self_attn.out_proj");
    l.ln1_w = tensor(p + "layer_norm1.weight");
    l.ln1_b = tensor(p + "layer_norm1.bias");
    l.fc1 = linear(p + "mlp.fc1");
    l.fc2 = linear(p + "mlp.fc2");
    l.ln2_w = tensor(p + "layer_norm2.weight");
    l.ln2_b = tensor(p + "layer_norm2.bias");
    w->layers.push_back(std::move(l));
  }
  w->final_w = tensor("text_model.final_layer_norm.weight");
  w->final_b = tensor("text_model.final_layer_norm.bias");
  source.close();
  m.bytes_loaded_ = loader.bytes_read() - before;
  m.w_ = std::move(w);
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

TensorMap ClipTextModel::forward(const at::Tensor& input_ids, Trace* trace) const {
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
  const auto opts = w.token.options();
  ids = ids.to(opts.device());

  at::Tensor h = at::embedding(w.token, ids) + w.position.narrow(0, 0, S).unsqueeze(0);
  record("hidden_states.0", h);
  // Causal mask: 0 on and below the diagonal, finfo.min above it.
  const at::Tensor mask = at::full({S, S}, lowest_of(opts.dtype().toScalarType()), opts).triu(1);
  const double scale = std::pow(static_cast<double>(hd), -0.5);
  auto split_heads = [&](const at::Tensor& y) { return y.view({B, S, -1, hd}).transpose(1, 2); };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const ClipLayerWeights& l = w.layers[i];
    at::Tensor x = at::layer_norm(h, {H}, l.ln1_w, l.ln1_b, c.layer_norm_eps);
    at::Tensor q = split_heads(l.q.forward(x)), k = split_heads(l.k.forward(x)), v = split_heads(l.v.forward(x));
    at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * scale + mask;
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    at::Tensor attn = at::matmul(probs, v).transpose(1, 2).reshape({B, S, H});
    h = h + l.out.forward(attn);
    x = at::layer_norm(h, {H}, l.ln2_w, l.ln2_b, c.layer_norm_eps);
    h = h + l.fc2.forward(hf_activation(l.fc1.forward(x), c.hidden_act));
    record(fmt::format("hidden_states.{}", i + 1), h);
  }
  at::Tensor last = at::layer_norm(h, {H}, w.final_w, w.final_b, c.layer_norm_eps);

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

}  // namespace tprun::models
