// QwenImageTransformer2DModel: config, plan validation, loading this rank's
// slices, the inputs' checks and the top-level forward (embeddings, RoPE,
// modulations, blocks, norm_out, proj_out).
#include "models/qwen_image_transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/weight_source.h"
#include "models/mmdit_blocks.h"
#include "models/model_config.h"
#include "models/model_inputs.h"
#include "models/model_registry.h"
#include "models/qwen_image_blocks.h"
#include "models/qwen_image_rope.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

// The variants tprun does not run, refused by name before anything is built.
void refuse_variant_flags(const nlohmann::json& c, const std::string& path) {
  const std::pair<const char*, const char*> flags[] = {
      {"use_layer3d_rope", "QwenEmbedLayer3DRope (Qwen-Image-Layered)"},
  };
  for (const auto& [field, what] : flags) {
    if (config_bool_or(c, field, path, false)) {
      throw ConfigError(fmt::format("{}: field '{}' is true: {} is not supported by tprun's {}; only the plain "
                                    "Qwen-Image transformer, zero_cond_t and use_additional_t_cond run",
                                    path, field, what, QwenImageTransformer::kClass),
                        true);
    }
  }
}

// Bounds of one image shape entry (RoPE tables: frames 0 .. 4095, rows and
// columns -4096 .. 4095).
constexpr int64_t kMaxFrames = kQwenRopePositions;
constexpr int64_t kMaxSide = 2 * kQwenRopePositions;

// img_shapes: integer [B, 3] or [B, N, 3], every sample the same; the image
// shapes of one sample, whose tokens must be `image_tokens`.
std::vector<QwenImageShape> image_shapes_input(const TensorMap& in, int64_t batch, int64_t image_tokens) {
  const at::Tensor given = input(in, "img_shapes", -1);
  const bool shaped = (given.dim() == 2 || given.dim() == 3) && given.size(0) == batch && given.size(-1) == 3 &&
                      given.numel() > 0 && (given.dim() == 2 || given.size(1) <= kQwenRopePositions);
  if (!c10::isIntegralType(given.scalar_type(), false) || !shaped) {
    throw RequestError(fmt::format("input 'img_shapes' must be an integer tensor [{}, 3] (frames, height, width in "
                                   "patches per sample) or [{}, N, 3] (N images per sample), got {} [{}]",
                                   batch, batch, c10::toString(given.scalar_type()), fmt::join(given.sizes(), ", ")),
                       true);
  }
  const at::Tensor s = (given.dim() == 2 ? given.unsqueeze(1) : given).to(at::kLong).cpu().contiguous();
  if (!at::equal(s, s.narrow(0, 0, 1).expand_as(s))) {
    throw RequestError("input 'img_shapes' differs between samples: diffusers builds the RoPE of the whole batch "
                       "from the first sample's shapes; batch only samples of the same shapes",
                       true);
  }
  const int64_t* p = s.data_ptr<int64_t>();
  std::vector<QwenImageShape> images;
  for (int64_t k = 0; k < s.size(1); ++k) {
    const QwenImageShape shape{p[3 * k], p[3 * k + 1], p[3 * k + 2]};
    if (shape[0] < 1 || shape[0] > kMaxFrames || shape[1] < 1 || shape[1] > kMaxSide || shape[2] < 1 ||
        shape[2] > kMaxSide) {
      throw RequestError(fmt::format("input 'img_shapes': image {} is ({}) (frames, height, width); frames must be "
                                     "in [1, {}], height and width in [1, {}]",
                                     k, fmt::join(shape, ", "), kMaxFrames, kMaxSide),
                         true);
    }
    images.push_back(shape);
  }
  if (qwen_image_tokens(images) != image_tokens) {
    throw RequestError(fmt::format("input 'img_shapes' gives {} image tokens per sample (sum of frames * height * "
                                   "width) but 'hidden_states' has {}",
                                   qwen_image_tokens(images), image_tokens),
                       true);
  }
  return images;
}

// encoder_hidden_states_mask [B, S_txt] -> the key mask [B, S_txt + S_img]
// (nonzero = attend; image keys always), or undefined when absent.
at::Tensor key_mask_input(const TensorMap& in, int64_t batch, int64_t text_tokens, int64_t image_tokens) {
  if (!has_input(in, "encoder_hidden_states_mask")) return {};
  const at::Tensor m = input(in, "encoder_hidden_states_mask", -1);
  if (m.dim() != 2 || m.size(0) != batch || m.size(1) != text_tokens) {
    throw RequestError(fmt::format("input 'encoder_hidden_states_mask' must be [{}, {}] (batch, text tokens of "
                                   "'encoder_hidden_states'), got [{}]",
                                   batch, text_tokens, fmt::join(m.sizes(), ", ")),
                       true);
  }
  const at::Tensor text = m.to(at::kBool);  // as diffusers: nonzero = a real token
  return at::cat({text, at::ones({batch, image_tokens}, text.options())}, 1);
}

// additional_t_cond [B] in {0, 1} -> int64, on `device`.
at::Tensor additional_t_cond_input(const TensorMap& in, int64_t batch, const at::Device& device) {
  const at::Tensor t = input(in, "additional_t_cond", -1);
  const at::Tensor flat = t.reshape({-1});
  if (!c10::isIntegralType(t.scalar_type(), false) || flat.numel() != batch) {
    throw RequestError(fmt::format("input 'additional_t_cond' must be an integer [{}] of 0 / 1, got {} [{}]", batch,
                                   c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", ")),
                       true);
  }
  const at::Tensor ids = flat.to(at::kLong);
  if ((ids < 0).any().item<bool>() || (ids > 1).any().item<bool>()) {
    throw RequestError("input 'additional_t_cond' must hold 0 or 1 (addition_t_embedding has 2 rows)", true);
  }
  return ids.to(device);
}

}  // namespace

QwenImageConfig QwenImageConfig::from_json(const nlohmann::json& c, const std::string& path,
                                           const TensorCensus* census) {
  refuse_variant_flags(c, path);
  QwenImageConfig f;  // defaults: diffusers' __init__
  f.layers = config_block_count(c, "num_layers", path, f.layers, census, {"transformer_blocks"});
  f.heads = config_positive(c, "num_attention_heads", path, f.heads, kMaxConfigHeads);
  f.head_dim = config_positive(c, "attention_head_dim", path, f.head_dim, kMaxConfigWidth);
  (void)config_product(path, {{"num_attention_heads", f.heads}, {"attention_head_dim", f.head_dim}}, kMaxConfigWidth);
  f.in_channels = config_positive(c, "in_channels", path, f.in_channels, kMaxConfigWidth);
  f.out_channels = config_out_channels(c, path, f.in_channels);
  f.patch = config_positive(c, "patch_size", path, f.patch, 64);
  (void)config_product(path, {{"out_channels", f.out_channels}, {"patch_size", f.patch}, {"patch_size", f.patch}},
                       kMaxConfigWidth);
  f.joint_dim = config_positive(c, "joint_attention_dim", path, f.joint_dim, kMaxConfigWidth);
  f.guidance = config_bool_or(c, "guidance_embeds", path, f.guidance);
  f.additional_t_cond = config_bool_or(c, "use_additional_t_cond", path, f.additional_t_cond);
  f.zero_cond_t = config_bool_or(c, "zero_cond_t", path, f.zero_cond_t);
  if (f.zero_cond_t && f.additional_t_cond) {
    // diffusers adds the [B, D] addition_t_embedding to the [2 B, D] zero_cond_t
    // embedding: a shape error for B > 1, both halves for B = 1.
    throw ConfigError(fmt::format("{}: fields 'zero_cond_t' and 'use_additional_t_cond' are both true: diffusers "
                                  "cannot run that combination for a batch over 1, tprun does not run it",
                                  path),
                      true);
  }
  f.axes_dims_rope = config_int_list_or(c, "axes_dims_rope", path, f.axes_dims_rope, 3, 4096);
  if (f.axes_dims_rope.size() != 3) {
    throw CheckpointError(fmt::format("{}: field 'axes_dims_rope' must have 3 entries (frame, height, width), got {}",
                                      path, f.axes_dims_rope.size()));
  }
  check_rope_axes(f.axes_dims_rope, f.head_dim, path);
  return f;
}

ModelTable QwenImageTransformer::table_for(const QwenImageConfig& config, const ModelOptions& options) {
  return record_table(kClass, [&](ModelBuilder& b) { declare_qwen_image(config, options.shard_modulation, b); });
}

std::unique_ptr<QwenImageTransformer> QwenImageTransformer::load(checkpoint::WeightSource& source,
                                                                 const nlohmann::json& config,
                                                                 const std::string& config_path,
                                                                 const parallel::TpContext& tp,
                                                                 const ModelOptions& options) {
  auto m = std::make_unique<QwenImageTransformer>();
  const TensorCensus census = census_of(source);
  m->config_ = QwenImageConfig::from_json(config, config_path, &census);
  const QwenImageConfig& c = m->config_;
  auto w = std::make_shared<QwenImageWeights>();
  m->load_weights(kClass, source, tp, options, class_skip_patterns(), {c.heads, c.head_dim, c.layers, 0},
                  [&](ModelBuilder& b) { *w = declare_qwen_image(c, options.shard_modulation, b); });
  m->w_ = std::move(w);
  return m;
}

TensorMap QwenImageTransformer::example_inputs(uint64_t seed) const {
  constexpr int64_t batch = 2, height = 4, width = 6, text = 7, padded = 3;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  TensorMap in;
  in["hidden_states"] = at::randn({batch, height * width, config_.in_channels}, gen, f32);
  in["encoder_hidden_states"] = at::randn({batch, text, config_.joint_dim}, gen, f32);
  at::Tensor mask = at::ones({batch, text}, f32.dtype(at::kLong));
  mask[1].narrow(0, text - padded, padded).fill_(0);
  in["encoder_hidden_states_mask"] = mask;
  in["timestep"] = at::tensor({0.7F, 0.3F}, f32);
  in["img_shapes"] = at::tensor({int64_t{1}, height, width, int64_t{1}, height, width}, f32.dtype(at::kLong))
                         .reshape({batch, 3});
  if (config_.additional_t_cond) in["additional_t_cond"] = at::tensor({int64_t{0}, int64_t{1}}, f32.dtype(at::kLong));
  return in;
}

at::Tensor QwenImageTransformer::run(const TensorMap& in, Trace* trace) const {
  const QwenImageWeights& w = *w_;
  const auto opts = w.img_in.weight().get().options();
  const mmdit::ToCompute to_compute = [&](const at::Tensor& t) {
    return t.to(opts.device(), opts.dtype().toScalarType());
  };
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };

  // Inputs, all checked before any compute.
  const at::Tensor hidden_in = sequence_input(in, "hidden_states", config_.in_channels, "in_channels");
  const at::Tensor encoder_in = sequence_input(in, "encoder_hidden_states", config_.joint_dim, "joint_attention_dim");
  const int64_t batch = hidden_in.size(0), image_tokens = hidden_in.size(1), text_tokens = encoder_in.size(1);
  if (encoder_in.size(0) != batch) {
    throw RequestError(fmt::format("input 'encoder_hidden_states' has batch {} but 'hidden_states' has {}",
                                   encoder_in.size(0), batch),
                       true);
  }
  if (has_input(in, "guidance")) {
    throw RequestError("input 'guidance' is not accepted: diffusers' QwenImageTransformer2DModel has no guidance "
                       "embedder (guidance_embeds builds nothing) and its forward fails when guidance is passed",
                       true);
  }
  if (!config_.additional_t_cond && has_input(in, "additional_t_cond")) {
    throw RequestError("this model has no use_additional_t_cond: drop input 'additional_t_cond'", true);
  }
  at::Tensor timestep = to_compute(scalar_per_sample(in, "timestep", batch));
  if (timestep.numel() != batch) timestep = timestep.expand({batch});
  if (config_.zero_cond_t) timestep = at::cat({timestep, timestep * 0});  // [2 B]: t, then 0
  const std::vector<QwenImageShape> images = image_shapes_input(in, batch, image_tokens);
  at::Tensor key_mask = key_mask_input(in, batch, text_tokens, image_tokens);
  if (key_mask.defined()) key_mask = key_mask.to(opts.device());
  const at::Tensor t_cond =
      config_.additional_t_cond ? additional_t_cond_input(in, batch, opts.device()) : at::Tensor();
  const nn::Rope rope = qwen_image_rope(images, text_tokens, config_.axes_dims_rope, opts.device());

  at::Tensor hidden = w.img_in.forward(to_compute(hidden_in));
  record("img_in", hidden);
  at::Tensor encoder = w.txt_in.forward(nn::diffusers_rms_norm(to_compute(encoder_in), w.txt_norm.get(), config_.eps));
  record("txt_in", encoder);

  // QwenTimestepProjEmbeddings: the timestep in the compute dtype, its
  // sinusoidal features, the two linears (+ addition_t_embedding[cond]).
  at::Tensor temb =
      w.timestep_embedder.forward(to_compute(qwen_timestep_features(timestep, config_.timestep_channels)));
  if (t_cond.defined()) temb = temb + w.addition_t_embedding.get().index_select(0, t_cond).to(temb.scalar_type());
  record("time_text_embed", temb);
  record("pos_embed.freqs_cos", *rope.cos);
  record("pos_embed.freqs_sin", *rope.sin);

  // Every block's modulations come from the same silu(temb); sharded, all
  // their partial sums share one AllReduce, else each is computed as its
  // block runs.
  // zero_cond_t: the image modulations see [2 B] embeddings (t, then 0);
  // the text modulations and norm_out the first B.
  const at::Tensor act_img = nn::silu(temb);
  const at::Tensor act = config_.zero_cond_t ? act_img.narrow(0, 0, batch) : act_img;
  at::Tensor conditioning_tokens;  // zero_cond_t: [1, S_img, 1], true after the first image's tokens
  if (config_.zero_cond_t) {
    const int64_t first = qwen_image_tokens({images.front()});
    conditioning_tokens = (at::arange(image_tokens, at::TensorOptions().dtype(at::kLong).device(opts.device())) >=
                           first)
                              .reshape({1, image_tokens, 1});
  }
  std::vector<at::Tensor> mod_out;
  if (shard_modulation_) {
    parallel::RowwiseBatch mods;
    for (const auto& blk : w.blocks) mods.add(blk.img_mod, act_img).add(blk.txt_mod, act);
    mod_out = parallel::rowwise_forward(mods);
  }
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    const QwenBlockWeights& blk = w.blocks[i];
    const at::Tensor img_mod = shard_modulation_ ? mod_out[2 * i] : blk.img_mod.forward(act_img);
    const at::Tensor txt_mod = shard_modulation_ ? mod_out[2 * i + 1] : blk.txt_mod.forward(act);
    qwen_block_forward(blk, config_, img_mod, txt_mod, conditioning_tokens, rope, key_mask, hidden, encoder,
                       attention_chunk());
    record(fmt::format("transformer_blocks.{}.encoder_hidden_states", i), encoder);
    record(fmt::format("transformer_blocks.{}.hidden_states", i), hidden);
  }

  hidden = mmdit::ada_norm_continuous(w.norm_out, act, hidden, config_.eps);
  record("norm_out", hidden);
  at::Tensor sample = w.proj_out.forward(hidden);
  record("proj_out", sample);
  return sample;
}

TPRUN_REGISTER_MODEL(QwenImageTransformer, QwenImageConfig);

}  // namespace tprun::models
