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

#include "checkpoint/weight_source.h"
#include "models/flux_blocks.h"
#include "models/mmdit_blocks.h"
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
  check_rope_axes(f.axes_dims_rope, f.head_dim, path);
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
  const FluxConfig& c = m->config_;
  auto w = std::make_shared<FluxWeights>();
  m->load_weights(kClass, source, tp, options, class_skip_patterns(), {c.heads, c.head_dim, c.layers, c.single_layers},
                  [&](ModelBuilder& b) { *w = declare_flux(c, options.shard_modulation, b); });
  m->w_ = std::move(w);
  return m;
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
  const mmdit::ToCompute to_compute = [&](const at::Tensor& t) {
    return t.to(opts.device(), opts.dtype().toScalarType());
  };
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };

  at::Tensor hidden = w.x_embedder.forward(to_compute(input(in, "hidden_states", 3)));
  record("x_embedder", hidden);
  // timestep / guidance: cast to the compute dtype, then * 1000 (as diffusers).
  at::Tensor temb =
      mmdit::embed_timestep(w.timestep_embedder, input(in, "timestep", -1).reshape({-1}), 256, to_compute);
  check_guidance_input(in, w.has_guidance);
  if (w.has_guidance) {
    temb = temb + mmdit::embed_timestep(w.guidance_embedder, input(in, "guidance", -1).reshape({-1}), 256, to_compute);
  }
  temb = temb + w.text_embedder.forward(to_compute(input(in, "pooled_projections", 2)));
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
                         attention_chunk());
    mi += 2;
    record(fmt::format("transformer_blocks.{}.encoder_hidden_states", i), encoder);
    record(fmt::format("transformer_blocks.{}.hidden_states", i), hidden);
  }
  for (size_t i = 0; i < w.singles.size(); ++i) {
    single_block_forward(w.singles[i], config_.head_dim, modulation(mi), rope, hidden, encoder, attention_chunk());
    ++mi;
    record(fmt::format("single_transformer_blocks.{}.encoder_hidden_states", i), encoder);
    record(fmt::format("single_transformer_blocks.{}.hidden_states", i), hidden);
  }

  hidden = mmdit::ada_norm_continuous(w.norm_out, act, hidden, 1e-6);
  record("norm_out", hidden);
  at::Tensor sample = w.proj_out.forward(hidden);
  record("proj_out", sample);
  return sample;
}

TPRUN_REGISTER_MODEL(FluxTransformer, FluxConfig);

}  // namespace tprun::models
