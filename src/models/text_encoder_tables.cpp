// The tensor tables of transformers' CLIPTextModel and T5EncoderModel (the
// FLUX.1 text encoders), the T5 encoder's tensor-parallel plan, and the
// config.json readers both encoders share. Names and module order as the
// models' state_dict() (what save_pretrained stores).
#include <fmt/format.h>

#include "models/clip_text_model.h"
#include "models/model_table.h"
#include "models/t5_encoder.h"
#include "runtime/error.h"

namespace tprun::models {

using checkpoint::ShardStyle;

double config_number_or(const nlohmann::json& c, const std::string& field, const std::string& path,
                        double fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  if (!c[field].is_number()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a number, found {}", path, field, c[field].dump()));
  }
  return c[field].get<double>();
}

std::string config_string_or(const nlohmann::json& c, const std::string& field, const std::string& path,
                             const std::string& fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  if (!c[field].is_string()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a string, found {}", path, field, c[field].dump()));
  }
  return c[field].get<std::string>();
}

namespace {

struct TableAdder {
  ModelTable& t;
  void add(const std::string& name, std::vector<int64_t> shape, bool optional = false) {
    TensorSpec s;
    s.name = name;
    s.shape = std::move(shape);
    s.optional = optional;
    t.tensors.push_back(std::move(s));
  }
  void linear(const std::string& name, int64_t out, int64_t in, bool bias) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
  }
};

}  // namespace

ModelTable clip_text_table(const ClipTextConfig& c) {
  ModelTable t;
  t.cls = "CLIPTextModel";
  t.num_attention_heads = c.heads;
  TableAdder a{t};
  const int64_t h = c.hidden_size;
  a.add("text_model.embeddings.token_embedding.weight", {c.vocab_size, h});
  a.add("text_model.embeddings.position_embedding.weight", {c.max_positions, h});
  a.add("text_model.embeddings.position_ids", {1, c.max_positions}, /*optional=*/true);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("text_model.encoder.layers.{}.", i);
    for (const char* n : {"k_proj", "v_proj", "q_proj", "out_proj"}) a.linear(p + "self_attn." + n, h, h, true);
    a.add(p + "layer_norm1.weight", {h});
    a.add(p + "layer_norm1.bias", {h});
    a.linear(p + "mlp.fc1", c.intermediate_size, h, true);
    a.linear(p + "mlp.fc2", h, c.intermediate_size, true);
    a.add(p + "layer_norm2.weight", {h});
    a.add(p + "layer_norm2.bias", {h});
  }
  a.add("text_model.final_layer_norm.weight", {h});
  a.add("text_model.final_layer_norm.bias", {h});
  return t;  // replicated: no plan
}

TpPlan t5_tp_plan(bool gated_act) {
  TpPlan plan = {
      {"encoder.block.*.layer.0.SelfAttention.q", ShardStyle::Colwise, {}},
      {"encoder.block.*.layer.0.SelfAttention.k", ShardStyle::Colwise, {}},
      {"encoder.block.*.layer.0.SelfAttention.v", ShardStyle::Colwise, {}},
      {"encoder.block.*.layer.0.SelfAttention.o", ShardStyle::Rowwise, {}},
  };
  if (gated_act) {
    plan.push_back({"encoder.block.*.layer.1.DenseReluDense.wi_0", ShardStyle::Colwise, {}});
    plan.push_back({"encoder.block.*.layer.1.DenseReluDense.wi_1", ShardStyle::Colwise, {}});
  } else {
    plan.push_back({"encoder.block.*.layer.1.DenseReluDense.wi", ShardStyle::Colwise, {}});
  }
  plan.push_back({"encoder.block.*.layer.1.DenseReluDense.wo", ShardStyle::Rowwise, {}});
  return plan;
}

ModelTable t5_encoder_table(const T5Config& c) {
  ModelTable t;
  t.cls = "T5EncoderModel";
  t.num_attention_heads = c.heads;
  TableAdder a{t};
  const int64_t d = c.d_model, inner = c.inner();
  a.add("shared.weight", {c.vocab_size, d});
  // Tied to shared.weight; save_pretrained drops it, older files may keep it.
  a.add("encoder.embed_tokens.weight", {c.vocab_size, d}, /*optional=*/true);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("encoder.block.{}.layer.", i);
    a.linear(p + "0.SelfAttention.q", inner, d, false);
    a.linear(p + "0.SelfAttention.k", inner, d, false);
    a.linear(p + "0.SelfAttention.v", inner, d, false);
    a.linear(p + "0.SelfAttention.o", d, inner, false);
    if (i == 0) a.add(p + "0.SelfAttention.relative_attention_bias.weight", {c.num_buckets, c.heads});
    a.add(p + "0.layer_norm.weight", {d});
    if (c.gated) {
      a.linear(p + "1.DenseReluDense.wi_0", c.d_ff, d, false);
      a.linear(p + "1.DenseReluDense.wi_1", c.d_ff, d, false);
    } else {
      a.linear(p + "1.DenseReluDense.wi", c.d_ff, d, false);
    }
    a.linear(p + "1.DenseReluDense.wo", d, c.d_ff, false);
    a.add(p + "1.layer_norm.weight", {d});
  }
  a.add("encoder.final_layer_norm.weight", {d});
  apply_tp_plan(t, t5_tp_plan(c.gated));
  return t;
}

void register_text_encoder_tables() {
  register_model_table("CLIPTextModel", [](const nlohmann::json& c, const std::string& path, const TableOptions&) {
    return clip_text_table(ClipTextConfig::from_json(c, path));
  });
  register_model_table("T5EncoderModel", [](const nlohmann::json& c, const std::string& path, const TableOptions&) {
    return t5_encoder_table(T5Config::from_json(c, path));
  });
}

}  // namespace tprun::models
