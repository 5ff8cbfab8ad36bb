// Flux2Transformer2DModel: config, plan validation, loading this rank's
// slices, and the top-level forward (embeddings, modulations, blocks,
// norm_out, proj_out).
#include "models/flux2_transformer.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/weight_source.h"
#include "models/flux2_blocks.h"
#include "models/mmdit_blocks.h"
#include "models/model_config.h"
#include "models/model_inputs.h"
#include "models/model_registry.h"
#include "runtime/error.h"

namespace tprun::models {

Flux2Config Flux2Config::from_json(const nlohmann::json& c, const std::string& path, const TensorCensus* census) {
  Flux2Config f;  // defaults: diffusers' __init__
  f.layers = config_block_count(c, "num_layers", path, f.layers, census, {"transformer_blocks"});
  f.single_layers = config_block_count(c, "num_single_layers", path, f.single_layers, census,
                                       {"single_transformer_blocks"});
  f.heads = config_positive(c, "num_attention_heads", path, f.heads, kMaxConfigHeads);
  f.head_dim = config_positive(c, "attention_head_dim", path, f.head_dim, kMaxConfigWidth);
  (void)config_product(path, {{"num_attention_heads", f.heads}, {"attention_head_dim", f.head_dim}}, kMaxConfigWidth);
  f.in_channels = config_positive(c, "in_channels", path, f.in_channels, kMaxConfigWidth);
  f.out_channels = config_positive(c, "out_channels", path, f.in_channels, kMaxConfigWidth);  // null: in_channels
  f.patch = config_positive(c, "patch_size", path, f.patch, 64);
  (void)config_product(path, {{"out_channels", f.out_channels}, {"patch_size", f.patch}, {"patch_size", f.patch}},
                       kMaxConfigWidth);
  f.joint_dim = config_positive(c, "joint_attention_dim", path, f.joint_dim, kMaxConfigWidth);
  f.timestep_channels = config_positive(c, "timestep_guidance_channels", path, f.timestep_channels, 65536);
  f.mlp_ratio = config_positive_number(c, "mlp_ratio", path, f.mlp_ratio, 64.0);
  f.rope_theta = config_positive_number(c, "rope_theta", path, f.rope_theta, 1e12);
  f.eps = config_positive_number(c, "eps", path, f.eps, 1.0);
  f.guidance = config_bool_or(c, "guidance_embeds", path, f.guidance);
  if (f.mlp_hidden() < 1) {
    throw CheckpointError(fmt::format("{}: field 'mlp_ratio' = {} gives an empty MLP (int({} * {}) = {})", path,
                                      f.mlp_ratio, f.inner(), f.mlp_ratio, f.mlp_hidden()));
  }
  f.axes_dims_rope = config_int_list_or(c, "axes_dims_rope", path, f.axes_dims_rope, 8, 4096);
  check_rope_axes(f.axes_dims_rope, f.head_dim, path);
  return f;
}

ModelTable Flux2Transformer::table_for(const Flux2Config& config, const ModelOptions& options) {
  return record_table(kClass, [&](ModelBuilder& b) { declare_flux2(config, options.shard_modulation, b); });
}

std::unique_ptr<Flux2Transformer> Flux2Transformer::load(checkpoint::WeightSource& source,
                                                         const nlohmann::json& config, const std::string& config_path,
                                                         const parallel::TpContext& tp, const ModelOptions& options) {
  auto m = std::make_unique<Flux2Transformer>();
  const TensorCensus census = census_of(source);
  m->config_ = Flux2Config::from_json(config, config_path, &census);
  const Flux2Config& c = m->config_;
  auto w = std::make_shared<Flux2Weights>();
  m->load_weights(kClass, source, tp, options, class_skip_patterns(), {c.heads, c.head_dim, c.layers, c.single_layers},
                  [&](ModelBuilder& b) { *w = declare_flux2(c, options.shard_modulation, b); });
  m->w_ = std::move(w);
  return m;
}

TensorMap Flux2Transformer::example_inputs(uint64_t seed) const {
  constexpr int64_t grid = 8, text = 8;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  TensorMap in;
  in["hidden_states"] = at::randn({1, grid * grid, config_.in_channels}, gen, f32);
  in["encoder_hidden_states"] = at::randn({1, text, config_.joint_dim}, gen, f32);
  in["timestep"] = at::full({1}, 0.5, f32);
  if (config_.guidance) in["guidance"] = at::full({1}, 4.0, f32);
  // Flux2Pipeline._prepare_latent_ids: (t, h, w, l) = (0, row, col, 0);
  // _prepare_text_ids: (0, 0, 0, token).
  const at::Tensor r = at::arange(grid * grid, f32), zi = at::zeros({grid * grid}, f32);
  in["img_ids"] = at::stack({zi, (r / grid).floor(), r.fmod(grid), zi}, 1);
  const at::Tensor zt = at::zeros({text}, f32);
  in["txt_ids"] = at::stack({zt, zt, zt, at::arange(text, f32)}, 1);
  return in;
}

at::Tensor Flux2Transformer::run(const TensorMap& in, Trace* trace) const {
  const Flux2Weights& w = *w_;
  const auto opts = w.x_embedder.weight().get().options();
  const mmdit::ToCompute to_compute = [&](const at::Tensor& t) {
    return t.to(opts.device(), opts.dtype().toScalarType());
  };
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };

  const at::Tensor hidden_in = sequence_input(in, "hidden_states", config_.in_channels, "in_channels");
  const at::Tensor encoder_in = sequence_input(in, "encoder_hidden_states", config_.joint_dim, "joint_attention_dim");
  const int64_t batch = hidden_in.size(0);
  if (encoder_in.size(0) != batch) {
    throw RequestError(fmt::format("input 'encoder_hidden_states' has batch {} but 'hidden_states' has {}",
                                   encoder_in.size(0), batch),
                       true);
  }
  check_guidance_input(in, w.has_guidance);

  // Flux2TimestepGuidanceEmbeddings: timestep / guidance cast to the compute
  // dtype, * 1000, Timesteps(flip_sin_to_cos, shift 0) -> linear_1 -> silu -> linear_2.
  const int64_t channels = config_.timestep_channels;
  at::Tensor temb = mmdit::embed_timestep(w.timestep_embedder, scalar_per_sample(in, "timestep", batch), channels,
                                          to_compute);
  if (w.has_guidance) {
    temb = temb + mmdit::embed_timestep(w.guidance_embedder, scalar_per_sample(in, "guidance", batch), channels,
                                        to_compute);
  }
  record("time_guidance_embed", temb);

  // Flux2Modulation: silu(temb) -> linear, once per forward, shared by every
  // block of its kind; with shard_modulation the three partial sums share one AllReduce.
  const at::Tensor act = nn::silu(temb);
  std::vector<at::Tensor> mods;
  if (shard_modulation_) {
    mods = parallel::rowwise_forward(
        parallel::RowwiseBatch().add(w.mod_img, act).add(w.mod_txt, act).add(w.mod_single, act));
  } else {
    mods = {w.mod_img.forward(act), w.mod_txt.forward(act), w.mod_single.forward(act)};
  }

  at::Tensor hidden = w.x_embedder.forward(to_compute(hidden_in));
  record("x_embedder", hidden);
  at::Tensor encoder = w.context_embedder.forward(to_compute(encoder_in));
  record("context_embedder", encoder);

  // Flux2PosEmbed over cat(txt_ids, img_ids), one block of columns per axis.
  const size_t axes = config_.axes_dims_rope.size();
  const at::Tensor txt_ids = ids_input(in, "txt_ids", encoder.size(1), axes);
  const at::Tensor img_ids = ids_input(in, "img_ids", hidden.size(1), axes);
  const at::Tensor ids = at::cat({txt_ids.to(at::kFloat), img_ids.to(at::kFloat)}, 0).to(opts.device());
  const nn::Rope rope = nn::rope_frequencies(ids, config_.axes_dims_rope, config_.rope_theta);
  record("pos_embed.freqs_cos", *rope.cos);
  record("pos_embed.freqs_sin", *rope.sin);

  for (size_t i = 0; i < w.doubles.size(); ++i) {
    flux2_double_block_forward(w.doubles[i], config_, mods[0], mods[1], rope, hidden, encoder, attention_chunk());
    record(fmt::format("transformer_blocks.{}.encoder_hidden_states", i), encoder);
    record(fmt::format("transformer_blocks.{}.hidden_states", i), hidden);
  }
  const int64_t txt = encoder.size(1);
  at::Tensor joint = at::cat({encoder, hidden}, 1);
  for (size_t i = 0; i < w.singles.size(); ++i) {
    flux2_single_block_forward(w.singles[i], config_, mods[2], rope, joint, attention_chunk());
    record(fmt::format("single_transformer_blocks.{}.hidden_states", i), joint);
  }
  hidden = joint.narrow(1, txt, joint.size(1) - txt);

  hidden = mmdit::ada_norm_continuous(w.norm_out, act, hidden, config_.eps);
  record("norm_out", hidden);
  at::Tensor sample = w.proj_out.forward(hidden);
  record("proj_out", sample);
  return sample;
}

TPRUN_REGISTER_MODEL(Flux2Transformer, Flux2Config);

}  // namespace tprun::models
