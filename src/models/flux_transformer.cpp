// FluxTransformer2DModel: config, plan validation, loading this rank's slices,
// and the top-level forward (embeddings, blocks, norm_out, proj_out).
#include "models/flux_transformer.h"


#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/flux_blocks.h"
#include "models/model_config.h"
#include "models/model_inputs.h"
#include "models/model_registry.h"
#include "runtime/error.h"

namespace tprun::models {

FluxConfig FluxConfig::from_json(const nlohmann::json& c, const std::string& path, const TensorCensus* census) {
  FluxConfig f;
  (void)config_int(c, "num_layers", path);  // both required
  (void)config_int(c, "num_single_layers", path);
  f.layers = config_block_count(c, "num_layers", path, 0, census, {"transformer_blocks"});
  f.single_layers = config_block_count(c, "num_single_layers", path, 0, census, {"single_transformer_blocks"});
  f.heads = config_positive_required(c, "num_attention_heads", path, kMaxConfigHeads);
  f.head_dim = config_positive_required(c, "attention_head_dim", path, kMaxConfigWidth);
  (void)config_product(path, {{"num_attention_heads", f.heads}, {"attention_head_dim", f.head_dim}}, kMaxConfigWidth);
  f.in_channels = config_positive_required(c, "in_channels", path, kMaxConfigWidth);
  f.out_channels = config_positive(c, "out_channels", path, f.in_channels, kMaxConfigWidth);
  f.patch = config_positive(c, "patch_size", path, 1, 64);
  (void)config_product(path, {{"out_channels", f.out_channels}, {"patch_size", f.patch}, {"patch_size", f.patch}},
                       kMaxConfigWidth);
  f.joint_dim = config_positive_required(c, "joint_attention_dim", path, kMaxConfigWidth);
  f.pooled_dim = config_positive_required(c, "pooled_projection_dim", path, kMaxConfigWidth);
  f.guidance = c.contains("guidance_embeds") && c["guidance_embeds"].is_boolean() && c["guidance_embeds"].get<bool>();
  f.axes_dims_rope = config_int_list_or(c, "axes_dims_rope", path, {16, 56, 56}, 8, 4096);  // diffusers' default
  int64_t rope_sum = 0;
  for (int64_t d : f.axes_dims_rope) {
    if (d % 2 != 0) throw CheckpointError(fmt::format("{}: axes_dims_rope entries must be even and positive", path));
    rope_sum += d;
  }
  if (rope_sum != f.head_dim) {
    throw CheckpointError(fmt::format("{}: axes_dims_rope sums to {} but attention_head_dim is {}", path, rope_sum,
                                      f.head_dim));
  }
  return f;
}


ModelTable FluxTransformer::table_for(const FluxConfig& config, const ModelOptions& options) {
  return record_table(kClass, [&](ModelBuilder& b) { declare_flux(config, options.shard_modulation, b); });
}

std::unique_ptr<FluxTransformer> FluxTransformer::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                       const std::string& config_path, const parallel::TpContext& tp,
                                                       const ModelOptions& options) {
  auto m = std::make_unique<FluxTransformer>();
  const TensorCensus census = census_of(source);
  m->config_ = FluxConfig::from_json(config, config_path, &census);
  m->tp_ = tp;
  m->shard_modulation_ = options.shard_modulation;
  m->attention_chunk_ = nn::checked_attention_chunk(options.memory.attention_chunk);
  auto w = std::make_shared<FluxWeights>();
  BuiltModel built = build_model(kClass, source, tp, build_options(options, class_skip_patterns()),
                                 [&](ModelBuilder& b) { *w = declare_flux(m->config_, options.shard_modulation, b); });
  m->table_ = std::move(built.table);
  m->bytes_loaded_ = built.bytes_read;
  m->bytes_stored_ = built.bytes_stored;
  m->w_ = std::move(w);
  nn::log_sdpa_attention(kClass, options.device, checkpoint::parse_compute_dtype(options.dtype, "dtype"),
                         m->config_.heads / tp.size, m->config_.head_dim, false, m->attention_chunk_);
  return m;
}

int64_t FluxTransformer::all_reduces_per_forward() const {
  if (tp_.size == 1) return 0;
  return 2 * config_.layers + config_.single_layers + (shard_modulation_ ? 1 : 0);
}

TensorMap FluxTransformer::forward(const TensorMap& inputs, Trace* trace) const {
  return {{"sample", run(inputs, trace)}};
}

TensorMap FluxTransformer::example_inputs(uint64_t seed) const {
  // An 8 x 8 image grid and 8 text tokens, N(0, 1); timestep 0.5, guidance 3.5.
  constexpr int64_t grid = 8, text = 8;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  TensorMap in;
  in["hidden_states"] = at::randn({1, grid * grid, config_.in_channels}, gen, f32);
  in["encoder_hidden_states"] = at::randn({1, text, config_.joint_dim}, gen, f32);
  in["pooled_projections"] = at::randn({1, config_.pooled_dim}, gen, f32);
  in["timestep"] = at::full({1}, 0.5, f32);
  if (config_.guidance) in["guidance"] = at::full({1}, 3.5, f32);
  at::Tensor r = at::arange(grid * grid, f32);
  in["img_ids"] = at::stack({at::zeros({grid * grid}, f32), (r / grid).floor(), r.fmod(grid)}, 1);
  in["txt_ids"] = at::zeros({text, 3}, f32);
  return in;
}

at::Tensor FluxTransformer::run(const TensorMap& in, FluxTrace* trace) const {
  const FluxWeights& w = *w_;
  const auto opts = w.x_embedder.weight().get().options();
  auto to_compute = [&](const at::Tensor& t) { return t.to(opts.device(), opts.dtype().toScalarType()); };
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };

  at::Tensor hidden = w.x_embedder.forward(to_compute(input(in, "hidden_states", 3)));
  record("x_embedder", hidden);
  // timestep / guidance: cast to the compute dtype, then * 1000 (as diffusers).
  at::Tensor t = to_compute(input(in, "timestep", -1).reshape({-1})) * 1000;
  at::Tensor temb = w.t_lin2.forward(nn::silu(w.t_lin1.forward(to_compute(nn::timestep_embedding(t, 256, true, 0)))));
  check_guidance_input(in, w.has_guidance);
  if (w.has_guidance) {
    at::Tensor g = to_compute(input(in, "guidance", -1).reshape({-1})) * 1000;
    temb = temb + w.g_lin2.forward(nn::silu(w.g_lin1.forward(to_compute(nn::timestep_embedding(g, 256, true, 0)))));
  }
  temb = temb + w.p_lin2.forward(nn::silu(w.p_lin1.forward(to_compute(input(in, "pooled_projections", 2)))));
  record("time_text_embed", temb);
  at::Tensor encoder = w.context_embedder.forward(to_compute(input(in, "encoder_hidden_states", 3)));
  record("context_embedder", encoder);

  const size_t axes = config_.axes_dims_rope.size();
  const at::Tensor txt_ids = ids_input(in, "txt_ids", encoder.size(1), axes);
  const at::Tensor img_ids = ids_input(in, "img_ids", hidden.size(1), axes);
  at::Tensor ids = at::cat({txt_ids, img_ids}, 0).to(opts.device());
  nn::Rope rope = nn::rope_frequencies(ids, config_.axes_dims_rope, config_.rope_theta);
  record("pos_embed.freqs_cos", *rope.cos);
  record("pos_embed.freqs_sin", *rope.sin);

  // AdaLN modulations of every block; with shard_modulation their partial
  // sums share one AllReduce (silu(temb) is the same for all blocks), else
  // each is computed as its block runs (so an offloaded block's weights
  // come to the device once per forward).
  const at::Tensor act = nn::silu(temb);
  std::vector<const parallel::ParallelLinear*> mods;
  for (const auto& d : w.doubles) {
    mods.push_back(&d.norm1);
    mods.push_back(&d.norm1_context);
  }
  for (const auto& s : w.singles) mods.push_back(&s.norm);
  std::vector<at::Tensor> mod_out;
  if (shard_modulation_) {
    parallel::RowwiseBatch batch;
    for (const auto* l : mods) batch.add(*l, act);
    mod_out = parallel::rowwise_forward(batch);
  }
  auto modulation = [&](size_t k) { return shard_modulation_ ? mod_out[k] : mods[k]->forward(act); };

  size_t mi = 0;
  for (size_t i = 0; i < w.doubles.size(); ++i) {
    double_block_forward(w.doubles[i], config_.head_dim, modulation(mi), modulation(mi + 1), rope, hidden, encoder,
                         attention_chunk_);
    mi += 2;
    record(fmt::format("transformer_blocks.{}.encoder_hidden_states", i), encoder);
    record(fmt::format("transformer_blocks.{}.hidden_states", i), hidden);
  }
  for (size_t i = 0; i < w.singles.size(); ++i) {
    single_block_forward(w.singles[i], config_.head_dim, modulation(mi), rope, hidden, encoder, attention_chunk_);
    ++mi;
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

TPRUN_REGISTER_MODEL(FluxTransformer, FluxConfig);

}  // namespace tprun::models
