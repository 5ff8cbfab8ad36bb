// FluxTransformer2DModel: config, plan validation, loading this rank's slices,
// and the top-level forward (embeddings, blocks, norm_out, proj_out).
#include "models/flux_transformer.h"


#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_source.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "dist/communicator.h"
#include "models/flux_blocks.h"
#include "runtime/error.h"

namespace tprun::models {

using checkpoint::ShardStyle;

FluxConfig FluxConfig::from_json(const nlohmann::json& c, const std::string& path) {
  FluxConfig f;
  f.heads = config_int(c, "num_attention_heads", path);
  f.head_dim = config_int(c, "attention_head_dim", path);
  f.layers = config_int(c, "num_layers", path);
  f.single_layers = config_int(c, "num_single_layers", path);
  f.in_channels = config_int(c, "in_channels", path);
  f.out_channels = config_int_or_null(c, "out_channels", path).value_or(f.in_channels);
  f.patch = config_int_or_null(c, "patch_size", path).value_or(1);
  f.joint_dim = config_int(c, "joint_attention_dim", path);
  f.pooled_dim = config_int(c, "pooled_projection_dim", path);
  f.guidance = c.contains("guidance_embeds") && c["guidance_embeds"].is_boolean() && c["guidance_embeds"].get<bool>();
  if (c.contains("axes_dims_rope") && c["axes_dims_rope"].is_array()) {
    for (const auto& v : c["axes_dims_rope"]) {
      if (!v.is_number_integer()) throw CheckpointError(fmt::format("{}: axes_dims_rope must hold integers", path));
      f.axes_dims_rope.push_back(v.get<int64_t>());
    }
  } else {
    f.axes_dims_rope = {16, 56, 56};  // diffusers' default
  }
  int64_t rope_sum = 0;
  for (int64_t d : f.axes_dims_rope) {
    if (d <= 0 || d % 2 != 0) throw CheckpointError(fmt::format("{}: axes_dims_rope entries must be even and positive", path));
    rope_sum += d;
  }
  if (rope_sum != f.head_dim) {
    throw CheckpointError(fmt::format("{}: axes_dims_rope sums to {} but attention_head_dim is {}", path, rope_sum,
                                      f.head_dim));
  }
  return f;
}

namespace {

struct Builder {
  checkpoint::ShardLoader& loader;
  const ModelTable& table;
  const parallel::TpContext& tp;

  parallel::ParallelLinear linear(const std::string& prefix) const {
    const std::string b = prefix + ".bias";
    return parallel::ParallelLinear::load(loader, prefix, table.request(prefix + ".weight", tp.rank, tp.size),
                                          table.find(b) != nullptr, table.request(b, tp.rank, tp.size));
  }
  TensorPtr tensor(const std::string& name) const {
    return std::make_shared<at::Tensor>(loader.load(name, table.request(name, tp.rank, tp.size)));
  }
};

at::Tensor input(const TensorMap& in, const std::string& name, int64_t dims) {
  auto it = in.find(name);
  if (it == in.end() || !it->second.defined()) throw RequestError(fmt::format("input '{}' is missing", name), true);
  if (dims >= 0 && it->second.dim() != dims) {
    throw RequestError(fmt::format("input '{}' must have {} dims, got {}", name, dims, it->second.dim()), true);
  }
  return it->second;
}

}  // namespace

FluxTransformer FluxTransformer::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                      const std::string& config_path, const parallel::TpContext& tp,
                                      const FluxLoadOptions& options) {
  FluxTransformer m;
  m.config_ = FluxConfig::from_json(config, config_path);
  m.tp_ = tp;
  m.shard_modulation_ = options.shard_modulation;
  TableOptions topts;
  topts.shard_modulation = options.shard_modulation;
  auto table = model_table_for(config, config_path, topts);
  if (!table || table->cls != "FluxTransformer2DModel") {
    throw CheckpointError(fmt::format("{}: not a FluxTransformer2DModel config", config_path));
  }
  validate_tp_plan(*table, source, tp.size);
  parallel::check_tp_context(tp);

  checkpoint::LoadOptions lopts{options.mode, options.device, options.dtype};
  checkpoint::ShardLoader loader(source, lopts);
  const uint64_t before = loader.bytes_read();
  Builder b{loader, *table, tp};
  auto w = std::make_shared<FluxWeights>();
  w->x_embedder = b.linear("x_embedder");
  w->context_embedder = b.linear("context_embedder");
  w->t_lin1 = b.linear("time_text_embed.timestep_embedder.linear_1");
  w->t_lin2 = b.linear("time_text_embed.timestep_embedder.linear_2");
  w->has_guidance = m.config_.guidance;
  if (w->has_guidance) {
    w->g_lin1 = b.linear("time_text_embed.guidance_embedder.linear_1");
    w->g_lin2 = b.linear("time_text_embed.guidance_embedder.linear_2");
  }
  w->p_lin1 = b.linear("time_text_embed.text_embedder.linear_1");
  w->p_lin2 = b.linear("time_text_embed.text_embedder.linear_2");
  for (int64_t i = 0; i < m.config_.layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    DoubleBlockWeights d;
    d.norm1 = b.linear(p + "norm1.linear");
    d.norm1_context = b.linear(p + "norm1_context.linear");
    d.norm_q = b.tensor(p + "attn.norm_q.weight");
    d.norm_k = b.tensor(p + "attn.norm_k.weight");
    d.norm_added_q = b.tensor(p + "attn.norm_added_q.weight");
    d.norm_added_k = b.tensor(p + "attn.norm_added_k.weight");
    d.to_q = b.linear(p + "attn.to_q");
    d.to_k = b.linear(p + "attn.to_k");
    d.to_v = b.linear(p + "attn.to_v");
    d.add_q = b.linear(p + "attn.add_q_proj");
    d.add_k = b.linear(p + "attn.add_k_proj");
    d.add_v = b.linear(p + "attn.add_v_proj");
    d.to_out = b.linear(p + "attn.to_out.0");
    d.to_add_out = b.linear(p + "attn.to_add_out");
    d.ff_in = b.linear(p + "ff.net.0.proj");
    d.ff_out = b.linear(p + "ff.net.2");
    d.ffc_in = b.linear(p + "ff_context.net.0.proj");
    d.ffc_out = b.linear(p + "ff_context.net.2");
    w->doubles.push_back(std::move(d));
  }
  for (int64_t i = 0; i < m.config_.single_layers; ++i) {
    const std::string p = fmt::format("single_transformer_blocks.{}.", i);
    SingleBlockWeights s;
    s.norm = b.linear(p + "norm.linear");
    s.norm_q = b.tensor(p + "attn.norm_q.weight");
    s.norm_k = b.tensor(p + "attn.norm_k.weight");
    s.to_q = b.linear(p + "attn.to_q");
    s.to_k = b.linear(p + "attn.to_k");
    s.to_v = b.linear(p + "attn.to_v");
    s.proj_mlp = b.linear(p + "proj_mlp");
    s.proj_out = b.linear(p + "proj_out");
    w->singles.push_back(std::move(s));
  }
  w->norm_out = b.linear("norm_out.linear");
  w->proj_out = b.linear("proj_out");
  source.close();
  m.bytes_loaded_ = loader.bytes_read() - before;
  m.w_ = std::move(w);
  return m;
}

int64_t FluxTransformer::all_reduces_per_forward() const {
  if (tp_.size == 1) return 0;
  return 2 * config_.layers + config_.single_layers + (shard_modulation_ ? 1 : 0);
}

at::Tensor FluxTransformer::forward(const TensorMap& in, FluxTrace* trace) const {
  const FluxWeights& w = *w_;
  const at::Tensor& w0 = *w.x_embedder.weights().weight;
  const auto opts = w0.options();
  auto to_compute = [&](const at::Tensor& t) { return t.to(opts.device(), opts.dtype().toScalarType()); };
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };

  at::Tensor hidden = w.x_embedder.forward(to_compute(input(in, "hidden_states", 3)));
  record("x_embedder", hidden);
  // timestep / guidance: cast to the compute dtype, then * 1000 (as diffusers).
  at::Tensor t = to_compute(input(in, "timestep", -1).reshape({-1})) * 1000;
  at::Tensor temb = w.t_lin2.forward(nn::silu(w.t_lin1.forward(to_compute(nn::timestep_embedding(t, 256, true, 0)))));
  const bool has_g = in.count("guidance") && in.at("guidance").defined();
  if (w.has_guidance && !has_g) throw RequestError("this model has guidance_embeds: input 'guidance' is required", true);
  if (!w.has_guidance && has_g) throw RequestError("this model has no guidance embedder: drop input 'guidance'", true);
  if (w.has_guidance) {
    at::Tensor g = to_compute(input(in, "guidance", -1).reshape({-1})) * 1000;
    temb = temb + w.g_lin2.forward(nn::silu(w.g_lin1.forward(to_compute(nn::timestep_embedding(g, 256, true, 0)))));
  }
  temb = temb + w.p_lin2.forward(nn::silu(w.p_lin1.forward(to_compute(input(in, "pooled_projections", 2)))));
  record("time_text_embed", temb);
  at::Tensor encoder = w.context_embedder.forward(to_compute(input(in, "encoder_hidden_states", 3)));
  record("context_embedder", encoder);

  at::Tensor txt_ids = input(in, "txt_ids", -1), img_ids = input(in, "img_ids", -1);
  if (txt_ids.dim() == 3) txt_ids = txt_ids[0];
  if (img_ids.dim() == 3) img_ids = img_ids[0];
  if (txt_ids.size(0) != encoder.size(1) || img_ids.size(0) != hidden.size(1)) {
    throw RequestError(fmt::format("txt_ids/img_ids have {}/{} rows but the sequences are {}/{} tokens",
                                   txt_ids.size(0), img_ids.size(0), encoder.size(1), hidden.size(1)),
                       true);
  }
  at::Tensor ids = at::cat({txt_ids, img_ids}, 0).to(opts.device());
  nn::Rope rope = nn::rope_frequencies(ids, config_.axes_dims_rope, config_.rope_theta);
  record("pos_embed.freqs_cos", *rope.cos);
  record("pos_embed.freqs_sin", *rope.sin);

  // AdaLN modulations of every block; with shard_modulation their partial
  // sums share one AllReduce (silu(temb) is the same for all blocks).
  const at::Tensor act = nn::silu(temb);
  std::vector<const parallel::ParallelLinear*> mods;
  for (const auto& d : w.doubles) {
    mods.push_back(&d.norm1);
    mods.push_back(&d.norm1_context);
  }
  for (const auto& s : w.singles) mods.push_back(&s.norm);
  std::vector<at::Tensor> mod_out;
  for (const auto* l : mods) mod_out.push_back(l->forward(act));
  if (shard_modulation_) {
    mod_out = all_reduce_coalesced(tp_, mod_out);
    for (size_t i = 0; i < mods.size(); ++i) mod_out[i] = mods[i]->add_bias(mod_out[i]);
  }

  size_t mi = 0;
  for (size_t i = 0; i < w.doubles.size(); ++i) {
    double_block_forward(w.doubles[i], tp_, config_.head_dim, mod_out[mi], mod_out[mi + 1], rope, hidden, encoder);
    mi += 2;
    record(fmt::format("transformer_blocks.{}.encoder_hidden_states", i), encoder);
    record(fmt::format("transformer_blocks.{}.hidden_states", i), hidden);
  }
  for (size_t i = 0; i < w.singles.size(); ++i) {
    single_block_forward(w.singles[i], tp_, config_.head_dim, mod_out[mi++], rope, hidden, encoder);
    record(fmt::format("single_transformer_blocks.{}.encoder_hidden_states", i), encoder);
    record(fmt::format("single_transformer_blocks.{}.hidden_states", i), hidden);
  }

  // AdaLayerNormContinuous: (scale, shift) = chunk(linear(silu(temb)), 2).
  auto ss = w.norm_out.forward(act).chunk(2, 1);
  hidden = nn::layer_norm(hidden, 1e-6) * (1 + ss[0].unsqueeze(1)) + ss[1].unsqueeze(1);
  record("norm_out", hidden);
  at::Tensor sample = w.proj_out.forward(hidden);
  record("proj_out", sample);
  return sample;
}

nlohmann::json read_component_config(const std::string& path, std::string* config_path) {
  if (checkpoint::is_hdf5_file(path)) {
    if (config_path) *config_path = path + " (config attribute)";
    return checkpoint::hdf5_config(path);
  }
  auto ck = checkpoint::ComponentCheckpoint::open(path);
  if (config_path) *config_path = path + "/config.json";
  return ck.config();
}

}  // namespace tprun::models
