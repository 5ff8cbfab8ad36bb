// The tensor table of diffusers' FluxTransformer2DModel (FLUX.1 dev/schnell),
// and diffusers' own tensor-parallel plan as data (flux_tp_plan):
//   double blocks: attn.to_q/to_k/to_v, attn.add_q_proj/add_k_proj/add_v_proj,
//                  ff.net.0.proj, ff_context.net.0.proj            colwise
//                  attn.to_out.0, attn.to_add_out, ff.net.2,
//                  ff_context.net.2                                 rowwise
//   single blocks: attn.to_q/to_k/to_v, proj_mlp                    colwise
//                  proj_out (packed [inner_dim, mlp_hidden_dim])    packed rowwise
// Row-wise biases are replicated (added once, after the AllReduce). Norms,
// embedders, norm_out and proj_out are replicated; the AdaLN modulation
// linears (norm1.linear, norm1_context.linear, norm.linear) too, unless
// TableOptions::shard_modulation makes them rowwise_split_input.

#include <fmt/format.h>

#include "models/model_table.h"
#include "runtime/error.h"

namespace tprun::models {

using checkpoint::ShardStyle;

TpPlan flux_tp_plan(int64_t inner_dim, int64_t mlp_hidden_dim, bool shard_modulation) {
  TpPlan plan = {
      {"transformer_blocks.*.attn.to_q", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.attn.to_k", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.attn.to_v", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.attn.add_q_proj", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.attn.add_k_proj", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.attn.add_v_proj", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.attn.to_out.0", ShardStyle::Rowwise, {}},
      {"transformer_blocks.*.attn.to_add_out", ShardStyle::Rowwise, {}},
      {"transformer_blocks.*.ff.net.0.proj", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.ff.net.2", ShardStyle::Rowwise, {}},
      {"transformer_blocks.*.ff_context.net.0.proj", ShardStyle::Colwise, {}},
      {"transformer_blocks.*.ff_context.net.2", ShardStyle::Rowwise, {}},
      {"single_transformer_blocks.*.attn.to_q", ShardStyle::Colwise, {}},
      {"single_transformer_blocks.*.attn.to_k", ShardStyle::Colwise, {}},
      {"single_transformer_blocks.*.attn.to_v", ShardStyle::Colwise, {}},
      {"single_transformer_blocks.*.proj_mlp", ShardStyle::Colwise, {}},
      {"single_transformer_blocks.*.proj_out", ShardStyle::PackedRowwise, {inner_dim, mlp_hidden_dim}},
  };
  if (shard_modulation) {
    plan.push_back({"transformer_blocks.*.norm1.linear", ShardStyle::RowwiseSplitInput, {}});
    plan.push_back({"transformer_blocks.*.norm1_context.linear", ShardStyle::RowwiseSplitInput, {}});
    plan.push_back({"single_transformer_blocks.*.norm.linear", ShardStyle::RowwiseSplitInput, {}});
  }
  return plan;
}

namespace {

ModelTable build_flux_table(const nlohmann::json& c, const std::string& path, const TableOptions& options) {
  ModelTable t;
  t.cls = "FluxTransformer2DModel";
  const int64_t heads = config_int(c, "num_attention_heads", path);
  const int64_t head_dim = config_int(c, "attention_head_dim", path);
  const int64_t layers = config_int(c, "num_layers", path);
  const int64_t single_layers = config_int(c, "num_single_layers", path);
  const int64_t in_channels = config_int(c, "in_channels", path);
  const int64_t out_channels = config_int_or_null(c, "out_channels", path).value_or(in_channels);
  const int64_t patch = config_int_or_null(c, "patch_size", path).value_or(1);
  const int64_t joint_dim = config_int(c, "joint_attention_dim", path);
  const int64_t pooled_dim = config_int(c, "pooled_projection_dim", path);
  const bool guidance = c.contains("guidance_embeds") && c["guidance_embeds"].is_boolean()
                            ? c["guidance_embeds"].get<bool>()
                            : false;
  for (int64_t v : {heads, head_dim, in_channels, out_channels, patch, joint_dim, pooled_dim}) {
    if (v <= 0) throw CheckpointError(fmt::format("{}: Flux sizes must be positive", path));
  }
  const int64_t inner = heads * head_dim;
  const int64_t ff = 4 * inner;   // FeedForward inner dim (mult 4)
  const int64_t mlp = 4 * inner;  // single block mlp_hidden_dim (mlp_ratio 4.0)
  t.num_attention_heads = heads;

  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorSpec s;
    s.name = name;
    s.shape = std::move(shape);
    t.tensors.push_back(std::move(s));
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    add(name + ".weight", {out, in});
    add(name + ".bias", {out});
  };

  // Every tensor, as diffusers saves it (all replicated until the plan applies).
  linear("x_embedder", inner, in_channels);  // in_channels already counts packed patches
  linear("context_embedder", inner, joint_dim);
  linear("time_text_embed.timestep_embedder.linear_1", inner, 256);
  linear("time_text_embed.timestep_embedder.linear_2", inner, inner);
  if (guidance) {
    linear("time_text_embed.guidance_embedder.linear_1", inner, 256);
    linear("time_text_embed.guidance_embedder.linear_2", inner, inner);
  }
  linear("time_text_embed.text_embedder.linear_1", inner, pooled_dim);
  linear("time_text_embed.text_embedder.linear_2", inner, inner);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    linear(p + "norm1.linear", 6 * inner, inner);
    linear(p + "norm1_context.linear", 6 * inner, inner);
    for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"})
      add(p + "attn." + n + ".weight", {head_dim});
    for (const char* n : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"})
      linear(p + "attn." + n, inner, inner);
    linear(p + "ff.net.0.proj", ff, inner);
    linear(p + "ff.net.2", inner, ff);
    linear(p + "ff_context.net.0.proj", ff, inner);
    linear(p + "ff_context.net.2", inner, ff);
  }
  for (int64_t i = 0; i < single_layers; ++i) {
    const std::string p = fmt::format("single_transformer_blocks.{}.", i);
    linear(p + "norm.linear", 3 * inner, inner);
    add(p + "attn.norm_q.weight", {head_dim});
    add(p + "attn.norm_k.weight", {head_dim});
    for (const char* n : {"to_q", "to_k", "to_v"}) linear(p + "attn." + n, inner, inner);
    linear(p + "proj_mlp", mlp, inner);
    linear(p + "proj_out", inner, inner + mlp);
  }
  linear("norm_out.linear", 2 * inner, inner);
  linear("proj_out", patch * patch * out_channels, inner);

  apply_tp_plan(t, flux_tp_plan(inner, mlp, options.shard_modulation));
  return t;
}

}  // namespace

void register_flux_table() { register_model_table("FluxTransformer2DModel", build_flux_table); }

}  // namespace tprun::models
