// The tensor table of diffusers' FluxTransformer2DModel (FLUX.1 dev/schnell),
// with diffusers' own tensor-parallel plan:
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
namespace {

using checkpoint::ShardStyle;

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

  auto add = [&](const std::string& name, std::vector<int64_t> shape, ShardStyle style = ShardStyle::Replicated,
                 const std::string& key = "", std::vector<int64_t> blocks = {}) {
    TensorSpec s;
    s.name = name;
    s.shape = std::move(shape);
    s.style = style;
    s.plan_key = key;
    s.blocks = std::move(blocks);
    t.tensors.push_back(std::move(s));
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    add(name + ".weight", {out, in});
    add(name + ".bias", {out});
  };
  // Colwise: weight and bias split on the output dim.
  auto colwise = [&](const std::string& prefix, const std::string& rel, const std::string& key, int64_t out,
                     int64_t in) {
    add(prefix + rel + ".weight", {out, in}, ShardStyle::Colwise, key);
    add(prefix + rel + ".bias", {out}, ShardStyle::Colwise, key);
  };
  // Rowwise: weight split on the input dim; bias whole, added after the reduce.
  auto rowwise = [&](const std::string& prefix, const std::string& rel, const std::string& key, int64_t out,
                     int64_t in, std::vector<int64_t> blocks = {}) {
    add(prefix + rel + ".weight", {out, in}, blocks.empty() ? ShardStyle::Rowwise : ShardStyle::PackedRowwise,
        key, blocks);
    add(prefix + rel + ".bias", {out}, ShardStyle::Replicated, key);
  };

  // AdaLN modulation: replicated, or rowwise_split_input behind the option.
  auto modulation = [&](const std::string& name, const std::string& key, int64_t out) {
    if (!options.shard_modulation) return linear(name, out, inner);
    add(name + ".weight", {out, inner}, ShardStyle::RowwiseSplitInput, key);
    add(name + ".bias", {out}, ShardStyle::Replicated, key);
  };

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
    const std::string k = "transformer_blocks.*.";
    modulation(p + "norm1.linear", k + "norm1.linear", 6 * inner);
    modulation(p + "norm1_context.linear", k + "norm1_context.linear", 6 * inner);
    for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"})
      add(p + "attn." + n + ".weight", {head_dim});
    for (const char* n : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"})
      colwise(p, std::string("attn.") + n, k + "attn." + n, inner, inner);
    rowwise(p, "attn.to_out.0", k + "attn.to_out.0", inner, inner);
    rowwise(p, "attn.to_add_out", k + "attn.to_add_out", inner, inner);
    colwise(p, "ff.net.0.proj", k + "ff.net.0.proj", ff, inner);
    rowwise(p, "ff.net.2", k + "ff.net.2", inner, ff);
    colwise(p, "ff_context.net.0.proj", k + "ff_context.net.0.proj", ff, inner);
    rowwise(p, "ff_context.net.2", k + "ff_context.net.2", inner, ff);
  }
  for (int64_t i = 0; i < single_layers; ++i) {
    const std::string p = fmt::format("single_transformer_blocks.{}.", i);
    const std::string k = "single_transformer_blocks.*.";
    modulation(p + "norm.linear", k + "norm.linear", 3 * inner);
    add(p + "attn.norm_q.weight", {head_dim});
    add(p + "attn.norm_k.weight", {head_dim});
    for (const char* n : {"to_q", "to_k", "to_v"}) colwise(p, std::string("attn.") + n, k + "attn." + n, inner, inner);
    colwise(p, "proj_mlp", k + "proj_mlp", mlp, inner);
    rowwise(p, "proj_out", k + "proj_out", inner, inner + mlp, {inner, mlp});
  }
  linear("norm_out.linear", 2 * inner, inner);
  linear("proj_out", patch * patch * out_channels, inner);
  return t;
}

}  // namespace

void register_flux_table() { register_model_table("FluxTransformer2DModel", build_flux_table); }

}  // namespace tprun::models
