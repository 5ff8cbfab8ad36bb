// WanTransformer3DModel: config, plan validation, loading this rank's slices,
// the inputs' checks and the top-level forward (patch embedding, RoPE,
// condition embedder, blocks, output modulation, proj_out, unpatchify).
#include "models/wan_transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_inputs.h"
#include "models/model_registry.h"
#include "models/wan_blocks.h"
#include "models/wan_rope.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

// The variants tprun does not run yet, refused by name before anything is built.
void refuse_variant_fields(const nlohmann::json& c, const std::string& path) {
  const std::pair<const char*, const char*> fields[] = {
      {"image_dim", "the image embedder of Wan image to video (I2V)"},
      {"added_kv_proj_dim", "the image key / value projections of Wan image to video (I2V)"},
      {"pos_embed_seq_len", "the image embedder's position embedding (Wan VACE / FLF2V)"},
  };
  for (const auto& [field, what] : fields) {
    if (c.is_object() && c.contains(field) && !c[field].is_null()) {
      throw ConfigError(fmt::format("{}: field '{}' is {}: {} is not supported by tprun's {} yet; only text to "
                                    "video (the field null) runs",
                                    path, field, c[field].dump(), what, WanTransformer::kClass),
                        true);
    }
  }
}

// A patch side larger than any Wan model's (1, 2, 2) by far, small enough that
// no product of the three with a channel count can overflow.
constexpr int64_t kMaxPatch = 64;
// rope_max_seq_len: positions per axis (diffusers' table holds that many rows).
constexpr int64_t kMaxRopePositions = int64_t{1} << 16;

std::array<int64_t, 3> patch_size_of(const nlohmann::json& c, const std::string& path) {
  const std::vector<int64_t> p = config_int_list_or(c, "patch_size", path, {1, 2, 2}, 3, kMaxPatch);
  if (p.size() != 3) {
    throw CheckpointError(fmt::format("{}: field 'patch_size' must have 3 entries (frames, height, width), got {}",
                                      path, p.size()));
  }
  return {p[0], p[1], p[2]};
}

// The latent video [B, C_in, F, H, W]: its grid in patches.
struct Grid {
  int64_t batch = 0, frames = 0, height = 0, width = 0;
  int64_t tokens() const { return frames * height * width; }
};

Grid grid_of(const at::Tensor& x, const WanTransformerConfig& c) {
  const auto& p = c.patch_size;
  const bool ok = x.size(0) >= 1 && x.size(1) == c.in_channels && x.size(2) >= p[0] && x.size(2) % p[0] == 0 &&
                  x.size(3) >= p[1] && x.size(3) % p[1] == 0 && x.size(4) >= p[2] && x.size(4) % p[2] == 0;
  if (!ok || !x.is_floating_point()) {
    throw RequestError(fmt::format("input 'hidden_states' must be a float [B, {}, F, H, W] (in_channels {}) with "
                                   "F, H, W positive multiples of patch_size ({}), got {} [{}]",
                                   c.in_channels, c.in_channels, fmt::join(p, ", "),
                                   c10::toString(x.scalar_type()), fmt::join(x.sizes(), ", ")),
                       true);
  }
  return {x.size(0), x.size(2) / p[0], x.size(3) / p[1], x.size(4) / p[2]};
}

// timestep [B] or one value, integer or float -> fp32 [B] (diffusers'
// get_timestep_embedding takes timesteps.float(), whatever the model's dtype).
at::Tensor timestep_input(const TensorMap& in, int64_t batch) {
  const at::Tensor given = input(in, "timestep", -1);
  if (given.dim() > 1) {
    throw RequestError(fmt::format("input 'timestep' must be [{}] or one value (per-token timesteps [B, S], Wan 2.2 "
                                   "TI2V's expand_timesteps, are not supported), got [{}]",
                                   batch, fmt::join(given.sizes(), ", ")),
                       true);
  }
  if (given.scalar_type() == at::kBool || given.is_complex()) {
    throw RequestError(fmt::format("input 'timestep' must be an integer or float tensor, got {}",
                                   c10::toString(given.scalar_type())),
                       true);
  }
  const at::Tensor t = scalar_per_sample(in, "timestep", batch).to(at::kFloat);
  return t.numel() == batch ? t : t.expand({batch});
}

}  // namespace

WanTransformerConfig WanTransformerConfig::from_json(const nlohmann::json& c, const std::string& path,
                                                     const TensorCensus* census) {
  refuse_variant_fields(c, path);
  WanTransformerConfig f;  // defaults: diffusers' __init__
  f.patch_size = patch_size_of(c, path);
  f.layers = config_block_count(c, "num_layers", path, f.layers, census, {"blocks"});
  f.heads = config_positive(c, "num_attention_heads", path, f.heads, kMaxConfigHeads);
  f.head_dim = config_positive(c, "attention_head_dim", path, f.head_dim, kMaxConfigWidth);
  if (f.head_dim % 2 != 0) {
    throw CheckpointError(fmt::format("{}: field 'attention_head_dim' = {} must be even (the 3-D RoPE rotates "
                                      "channel pairs)",
                                      path, f.head_dim));
  }
  (void)config_product(path, {{"num_attention_heads", f.heads}, {"attention_head_dim", f.head_dim}}, kMaxConfigWidth);
  f.in_channels = config_positive(c, "in_channels", path, f.in_channels, kMaxConfigWidth);
  f.out_channels = config_out_channels(c, path, f.in_channels);
  const auto& p = f.patch_size;
  (void)config_product(path, {{"in_channels", f.in_channels}, {"patch_size", p[0] * p[1] * p[2]}}, kMaxConfigWidth);
  (void)config_product(path, {{"out_channels", f.out_channels}, {"patch_size", p[0] * p[1] * p[2]}}, kMaxConfigWidth);
  f.text_dim = config_positive(c, "text_dim", path, f.text_dim, kMaxConfigWidth);
  f.freq_dim = config_positive(c, "freq_dim", path, f.freq_dim, kMaxConfigWidth);
  f.ffn_dim = config_positive(c, "ffn_dim", path, f.ffn_dim, kMaxConfigWidth);
  f.cross_attn_norm = config_bool_or(c, "cross_attn_norm", path, f.cross_attn_norm);
  if (c.contains("qk_norm") && c["qk_norm"].is_null()) {
    f.qk_norm.clear();  // null: diffusers still builds the across-heads norms
  } else {
    f.qk_norm = config_string_or(c, "qk_norm", path, f.qk_norm);
  }
  f.eps = config_positive_number(c, "eps", path, f.eps, 1.0);
  f.rope_max_seq_len = config_positive(c, "rope_max_seq_len", path, f.rope_max_seq_len, kMaxRopePositions);
  return f;
}

ModelTable WanTransformer::table_for(const WanTransformerConfig& config, const ModelOptions& options) {
  return record_table(kClass, [&](ModelBuilder& b) { declare_wan(config, options.shard_modulation, b); });
}

std::unique_ptr<WanTransformer> WanTransformer::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                     const std::string& config_path, const parallel::TpContext& tp,
                                                     const ModelOptions& options) {
  auto m = std::make_unique<WanTransformer>();
  const TensorCensus census = census_of(source);
  m->config_ = WanTransformerConfig::from_json(config, config_path, &census);
  const WanTransformerConfig& c = m->config_;
  m->tp_ = tp;
  m->shard_modulation_ = options.shard_modulation;
  m->attention_chunk_ = nn::checked_attention_chunk(options.memory.attention_chunk);
  auto w = std::make_shared<WanWeights>();
  BuiltModel built = build_model(kClass, source, tp, build_options(options, class_skip_patterns()),
                                 [&](ModelBuilder& b) { *w = declare_wan(c, options.shard_modulation, b); });
  m->table_ = std::move(built.table);
  m->bytes_loaded_ = built.bytes_read;
  m->lora_targets_ = built.lora_targets;
  m->bytes_stored_ = built.bytes_stored;
  m->w_ = std::move(w);
  nn::log_sdpa_attention(kClass, options.device, checkpoint::parse_compute_dtype(options.dtype, "dtype"),
                         c.heads / tp.size, c.head_dim, false, m->attention_chunk_);
  return m;
}

TensorMap WanTransformer::forward(const TensorMap& inputs, Trace* trace) const {
  return {{"sample", run(inputs, trace)}};
}

int64_t WanTransformer::all_reduces_per_forward() const {
  if (tp_.size == 1) return 0;
  return 5 * config_.layers + (shard_modulation_ ? 1 : 0);
}

TensorMap WanTransformer::example_inputs(uint64_t seed) const {
  constexpr int64_t batch = 2, frames = 3, height = 4, width = 6, text = 7;
  const auto& p = config_.patch_size;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  TensorMap in;
  in["hidden_states"] =
      at::randn({batch, config_.in_channels, frames * p[0], height * p[1], width * p[2]}, gen, f32);
  in["encoder_hidden_states"] = at::randn({batch, text, config_.text_dim}, gen, f32);
  in["timestep"] = at::tensor({700.0F, 300.0F}, f32);
  return in;
}

at::Tensor WanTransformer::run(const TensorMap& in, Trace* trace) const {
  const WanWeights& w = *w_;
  const WanTransformerConfig& c = config_;
  const at::Tensor patch_weight = w.patch_weight.get();
  const auto opts = patch_weight.options();
  const c10::ScalarType dtype = opts.dtype().toScalarType();
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };

  // Inputs, all checked before any compute.
  const at::Tensor video = input(in, "hidden_states", 5);
  const Grid g = grid_of(video, c);
  const at::Tensor text_in = sequence_input(in, "encoder_hidden_states", c.text_dim, "text_dim");
  if (text_in.size(0) != g.batch || text_in.size(1) < 1) {
    throw RequestError(fmt::format("input 'encoder_hidden_states' must be [{}, S_txt >= 1, {}] (the batch of "
                                   "'hidden_states'), got [{}]",
                                   g.batch, c.text_dim, fmt::join(text_in.sizes(), ", ")),
                       true);
  }
  const at::Tensor timestep = timestep_input(in, g.batch).to(opts.device());
  const nn::Rope rope = wan_rope(g.frames, g.height, g.width, c.head_dim, c.rope_max_seq_len, opts.device());
  record("rope.freqs_cos", *rope.cos);
  record("rope.freqs_sin", *rope.sin);

  // Patch embedding: the Conv3d with stride = kernel as one matmul over each
  // patch's (C_in, pt, ph, pw) values; tokens frame-major, then row, column.
  const auto& p = c.patch_size;
  const at::Tensor patches = video.to(opts.device(), dtype)
                                 .reshape({g.batch, c.in_channels, g.frames, p[0], g.height, p[1], g.width, p[2]})
                                 .permute({0, 2, 4, 6, 1, 3, 5, 7})
                                 .reshape({g.batch, g.tokens(), -1});
  at::Tensor hidden = at::linear(patches, patch_weight.reshape({c.inner(), -1}), w.patch_bias.get());
  record("patch_embedding", hidden);

  // Condition embedder: the time embedder in fp32 (kept so), temb rounded
  // to the compute dtype, then time_proj on its silu; the text embedder.
  const at::Tensor features = nn::timestep_embedding(timestep, c.freq_dim, true, 0.0);
  const at::Tensor temb = w.time_2.forward(nn::silu(w.time_1.forward(features))).to(dtype);
  record("condition_embedder.temb", temb);
  const at::Tensor temb_act = nn::silu(temb);
  // (rowwise_split_input under shard_modulation: reduced inside the layer.)
  const at::Tensor timestep_proj = w.time_proj.forward(temb_act).reshape({g.batch, 6, c.inner()});
  record("condition_embedder.timestep_proj", timestep_proj);
  const at::Tensor text = w.text_2.forward(nn::gelu_tanh(w.text_1.forward(text_in.to(opts.device(), dtype))));
  record("condition_embedder.text_embedder", text);

  const at::Tensor mod = timestep_proj.to(at::kFloat);
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    wan_block_forward(w.blocks[i], c, mod, text, rope, hidden, attention_chunk_);
    record(fmt::format("blocks.{}", i), hidden);
  }

  // Output: (shift, scale) = scale_shift_table + temb (fp32), LN without affine.
  const std::vector<at::Tensor> out_mod = (w.scale_shift_table.get() + temb.unsqueeze(1)).chunk(2, 1);
  hidden = (nn::layer_norm(hidden.to(at::kFloat), c.eps) * (1 + out_mod[1]) + out_mod[0]).to(dtype);
  record("norm_out", hidden);
  const at::Tensor out = w.proj_out.forward(hidden);  // [B, S, pt ph pw C_out]
  record("proj_out", out);
  return out.reshape({g.batch, g.frames, g.height, g.width, p[0], p[1], p[2], c.out_channels})
      .permute({0, 7, 1, 4, 2, 5, 3, 6})
      .reshape({g.batch, c.out_channels, g.frames * p[0], g.height * p[1], g.width * p[2]});
}

TPRUN_REGISTER_MODEL(WanTransformer, WanTransformerConfig);

}  // namespace tprun::models
