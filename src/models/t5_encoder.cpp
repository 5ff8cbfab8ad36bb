// T5EncoderModel: config, plan validation, loading this rank's slices and the
// tensor-parallel forward (see t5_encoder.h for the plan and the numerics).
#include "models/t5_encoder.h"

#include <cmath>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/clamp_max.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/log.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/text_encoder_common.h"
#include "parallel/parallel_linear.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

// "architectures"[0] when the config names one, else "".
std::string config_architecture(const nlohmann::json& c) {
  if (!c.is_object() || !c.contains("architectures") || !c["architectures"].is_array() ||
      c["architectures"].empty() || !c["architectures"][0].is_string())
    return {};
  return c["architectures"][0].get<std::string>();
}

}  // namespace

T5Config T5Config::from_json(const nlohmann::json& c, const std::string& path, const TensorCensus* census) {
  T5Config f;
  // The variant first: UMT5Config's defaults differ from T5Config's.
  const bool umt5_class = config_architecture(c) == T5Encoder::kUmt5Class;
  const std::string type = config_string_or(c, "model_type", path, umt5_class ? "umt5" : "t5");
  if (umt5_class && type != "umt5") {
    throw CheckpointError(fmt::format("{}: model_type '{}' is not a UMT5 encoder (architectures names {}, which "
                                      "expects 'umt5')",
                                      path, type, T5Encoder::kUmt5Class));
  }
  if (!umt5_class && type != "t5") {
    throw CheckpointError(fmt::format("{}: model_type '{}' is not a T5 encoder (expected 't5'{})", path, type,
                                      type == "umt5" ? fmt::format("; a UMT5 config names architectures [\"{}\"]",
                                                                   T5Encoder::kUmt5Class)
                                                     : ""));
  }
  std::string default_proj = "relu";
  if (umt5_class) {
    f.cls = T5Encoder::kUmt5Class;
    f.bias_per_block = true;
    f.vocab_size = 250112;
    f.d_ff = 1024;
    f.layers = 8;
    f.heads = 6;
    default_proj = "gated-gelu";
  }
  f.layers = config_block_count(c, "num_layers", path, f.layers, census, {"encoder.block"}, 1);
  auto get = [&](const char* field, int64_t& v, int64_t max) { v = config_positive(c, field, path, v, max); };
  get("vocab_size", f.vocab_size, kMaxConfigVocab);
  get("d_model", f.d_model, kMaxConfigWidth);
  get("d_kv", f.d_kv, kMaxConfigWidth);
  get("d_ff", f.d_ff, kMaxConfigWidth);
  get("num_heads", f.heads, kMaxConfigHeads);
  (void)config_product(path, {{"num_heads", f.heads}, {"d_kv", f.d_kv}}, kMaxConfigWidth);
  get("relative_attention_num_buckets", f.num_buckets, 4096);
  get("relative_attention_max_distance", f.max_distance, kMaxConfigVocab);
  if (f.num_buckets < 4) {
    throw CheckpointError(fmt::format("{}: field 'relative_attention_num_buckets' must be at least 4 for a "
                                      "bidirectional encoder, got {}",
                                      path, f.num_buckets));
  }
  f.layer_norm_eps = config_number_or(c, "layer_norm_epsilon", path, f.layer_norm_eps);
  // T5Config: "gated-ACT" or "ACT"; "gated-gelu" stands for gelu_new.
  const std::string proj = config_string_or(c, "feed_forward_proj", path, default_proj);
  const size_t dash = proj.find('-');
  if (dash == std::string::npos) {
    f.act = proj;
  } else if (proj.compare(0, dash, "gated") == 0 && proj.find('-', dash + 1) == std::string::npos) {
    f.gated = true;
    f.act = proj.substr(dash + 1);
  } else {
    throw CheckpointError(fmt::format("{}: field 'feed_forward_proj' = '{}' must be 'gated-ACT' or 'ACT'", path, proj));
  }
  if (proj == "gated-gelu") f.act = "gelu_new";
  if (!known_activation(f.act)) {
    throw CheckpointError(fmt::format("{}: field 'feed_forward_proj' = '{}': activation '{}' is not supported", path,
                                      proj, f.act));
  }
  return f;
}

at::Tensor t5_relative_position_bucket(const at::Tensor& rel, bool bidirectional, int64_t num_buckets,
                                       int64_t max_distance) {
  at::Tensor buckets = at::zeros_like(rel);
  at::Tensor n;
  if (bidirectional) {
    num_buckets /= 2;
    buckets = buckets + (rel > 0).to(at::kLong) * num_buckets;
    n = at::abs(rel);
  } else {
    n = -at::clamp_max(rel, 0);
  }
  // Half the buckets for exact distances, the other half log-spaced up to max_distance.
  const int64_t max_exact = num_buckets / 2;
  at::Tensor is_small = n < max_exact;
  at::Tensor large = (at::log(n.to(at::kFloat) / max_exact) /
                      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                      (num_buckets - max_exact))
                         .to(at::kLong) +
                     max_exact;
  large = at::clamp_max(large, num_buckets - 1);
  return buckets + at::where(is_small, n, large);
}

// ---- weights --------------------------------------------------------------

struct T5BlockWeights {
  parallel::Weight ln_attn, ln_ff;          // [d_model]
  parallel::ParallelLinear q, k, v, o;      // colwise x3, rowwise
  parallel::ParallelLinear wi_0, wi_1, wo;  // colwise (wi_0 is `wi` when not gated), rowwise
};

struct T5Weights {
  parallel::Weight shared;         // [vocab, d_model], replicated
  // [buckets, H], whole on every rank: block 0's (T5), or one per block (UMT5).
  std::vector<parallel::Weight> relative_bias;
  std::vector<T5BlockWeights> blocks;
  parallel::Weight final_ln;
  int64_t attention_chunk = 0;  // MemoryOptions::attention_chunk (nn::over_query_chunks; 0 = all at once)
};

namespace {

// transformers keeps DenseReluDense.wo in fp32 when the model is fp16
// (T5PreTrainedModel._keep_in_fp32_modules).
bool wo_in_fp32(const std::string& dtype) {
  return !dtype.empty() && checkpoint::parse_compute_dtype(dtype, "dtype") == at::kHalf;
}

// Names and module order as the state_dict (what save_pretrained stores).
T5Weights declare_t5(const T5Config& c, const std::string& dtype, ModelBuilder& b) {
  const int64_t d = c.d_model, inner = c.inner();
  const LinearDecl col = LinearDecl::colwise();
  const LinearDecl wo = LinearDecl::rowwise().in_dtype(wo_in_fp32(dtype) ? "fp32" : "");
  b.tp_divides("num_heads", c.heads);
  T5Weights w;
  w.shared = b.tensor("shared.weight", {c.vocab_size, d}, TensorKind::Embedding);
  // Tied to shared.weight; save_pretrained drops it, older files may keep it.
  b.unused("encoder.embed_tokens.weight", {c.vocab_size, d}, TensorKind::Embedding, /*saved=*/false);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("encoder.block.{}.layer.", i);
    T5BlockWeights blk;
    blk.q = b.linear(p + "0.SelfAttention.q", inner, d, col);
    blk.k = b.linear(p + "0.SelfAttention.k", inner, d, col);
    blk.v = b.linear(p + "0.SelfAttention.v", inner, d, col);
    blk.o = b.linear(p + "0.SelfAttention.o", d, inner, LinearDecl::rowwise());
    if (i == 0 || c.bias_per_block) {
      w.relative_bias.push_back(b.tensor(p + "0.SelfAttention.relative_attention_bias.weight",
                                         {c.num_buckets, c.heads}, TensorKind::Embedding));
    }
    blk.ln_attn = b.tensor(p + "0.layer_norm.weight", {d}, TensorKind::Norm);
    if (c.gated) {
      blk.wi_0 = b.linear(p + "1.DenseReluDense.wi_0", c.d_ff, d, col);
      blk.wi_1 = b.linear(p + "1.DenseReluDense.wi_1", c.d_ff, d, col);
    } else {
      blk.wi_0 = b.linear(p + "1.DenseReluDense.wi", c.d_ff, d, col);
    }
    blk.wo = b.linear(p + "1.DenseReluDense.wo", d, c.d_ff, wo);
    blk.ln_ff = b.tensor(p + "1.layer_norm.weight", {d}, TensorKind::Norm);
    w.blocks.push_back(std::move(blk));
  }
  w.final_ln = b.tensor("encoder.final_layer_norm.weight", {d}, TensorKind::Norm);
  return w;
}

}  // namespace

ModelTable T5Encoder::table_for(const T5Config& config, const ModelOptions& options) {
  return record_table(config.cls, [&](ModelBuilder& b) { declare_t5(config, options.dtype, b); });
}

std::unique_ptr<T5Encoder> T5Encoder::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                           const std::string& config_path, const parallel::TpContext& tp,
                                           const ModelOptions& options) {
  auto m = std::make_unique<T5Encoder>();
  const TensorCensus census = census_of(source);
  m->config_ = T5Config::from_json(config, config_path, &census);
  m->tp_ = tp;
  const int64_t attention_chunk = nn::checked_attention_chunk(options.memory.attention_chunk);
  auto w = std::make_shared<T5Weights>();
  BuiltModel built = build_model(m->config_.cls, source, tp, build_options(options, class_skip_patterns()),
                                 [&](ModelBuilder& b) { *w = declare_t5(m->config_, options.dtype, b); });
  w->attention_chunk = attention_chunk;
  nn::log_eager_attention(m->config_.cls, attention_chunk);
  m->table_ = std::move(built.table);
  m->bytes_loaded_ = built.bytes_read;
  m->lora_targets_ = built.lora_targets;
  m->bytes_stored_ = built.bytes_stored;
  m->w_ = std::move(w);
  return m;
}

int64_t T5Encoder::all_reduces_per_forward() const { return tp_.size == 1 ? 0 : 2 * config_.layers; }

// ---- forward --------------------------------------------------------------

namespace {

// T5LayerNorm: fp32 variance, no mean, no bias; cast to a half weight's dtype.
at::Tensor t5_layer_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor var = x.to(at::kFloat).pow(2).mean({-1}, /*keepdim=*/true);
  at::Tensor y = x * at::rsqrt(var + eps);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) y = y.to(weight.scalar_type());
  return weight * y;
}

// T5Block's fp16 clamp of inf values (a no-op for other dtypes).
at::Tensor clamp_fp16(const at::Tensor& h) {
  if (h.scalar_type() != at::kHalf) return h;
  const double max = 65504.0;
  const double v = at::isinf(h).any().item<bool>() ? max - 1000 : max;
  return at::clamp(h, -v, v);
}

}  // namespace

at::Tensor T5Encoder::encode(const at::Tensor& input_ids, Trace* trace) const {
  return encode(input_ids, at::Tensor(), trace);
}

at::Tensor T5Encoder::encode(const at::Tensor& input_ids, const at::Tensor& attention_mask, Trace* trace) const {
  const T5Weights& w = *w_;
  const T5Config& c = config_;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  at::Tensor ids = checked_input_ids(input_ids, c.vocab_size, c.cls, true).to(w.shared.get().device());
  const int64_t B = ids.size(0), L = ids.size(1);
  const int64_t local_heads = c.heads / tp_.size;

  at::Tensor h = at::embedding(w.shared.get(), ids);
  record("hidden_states.0", h);
  // Padded keys: finfo(dtype).min added to their scores (transformers' additive
  // bidirectional mask), [B, 1, 1, L]; none without a mask.
  at::Tensor mask_add;
  if (attention_mask.defined()) {
    const at::Tensor keep = attention_keep_mask(attention_mask, ids, c.cls);
    const double lowest = h.scalar_type() == at::kHalf       ? -65504.0
                          : h.scalar_type() == at::kBFloat16 ? -3.3895313892515355e38
                                                             : -3.4028234663852886e38;
    mask_add = at::where(keep, 0.0, lowest).to(h.scalar_type()).view({B, 1, 1, L});
  }
  at::Tensor position = at::arange(L, ids.options());
  at::Tensor bucket = t5_relative_position_bucket(position.unsqueeze(0) - position.unsqueeze(1), /*bidirectional=*/true,
                                                  c.num_buckets, c.max_distance);
  record("relative_position_bucket", bucket);
  // A block's position bias for this rank's heads, [1, heads, L, L].
  auto position_bias = [&](const at::Tensor& table) {
    return at::embedding(table, bucket).permute({2, 0, 1}).unsqueeze(0);
  };
  at::Tensor bias;
  if (!c.bias_per_block) {
    // Block 0's, shared by every block; computed for all heads, then sliced.
    bias = position_bias(w.relative_bias[0].get());
    record("position_bias", bias);
    if (tp_.size > 1) bias = bias.narrow(1, tp_.rank * local_heads, local_heads);  // this rank's heads
  }

  auto split_heads = [&](const at::Tensor& y) { return y.view({B, L, -1, c.d_kv}).transpose(1, 2); };
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    const T5BlockWeights& b = w.blocks[i];
    if (c.bias_per_block) {
      // UMT5: this block's own table, only this rank's heads' columns.
      const at::Tensor table = w.relative_bias[i].get();
      bias = position_bias(tp_.size > 1 ? table.narrow(1, tp_.rank * local_heads, local_heads) : table);
      record(fmt::format("position_bias.{}", i), bias);
    }
    // Self-attention, this rank's heads; no 1/sqrt(d) scaling in T5.
    at::Tensor x = t5_layer_norm(h, b.ln_attn.get(), c.layer_norm_eps);
    at::Tensor q = split_heads(b.q.forward(x)), k = split_heads(b.k.forward(x)), v = split_heads(b.v.forward(x));
    // With attention_chunk: the query rows (of q and of the bias) in chunks.
    at::Tensor attn = nn::over_query_chunks(L, w.attention_chunk, 2, [&](int64_t start, int64_t n) {
      auto rows = [&](const at::Tensor& t) { return n == L ? t : t.narrow(2, start, n); };
      at::Tensor scores = at::matmul(rows(q), k.transpose(3, 2)) + rows(bias);
      if (mask_add.defined()) scores = scores + mask_add;
      at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(scores.scalar_type());
      return at::matmul(probs, v);
    });
    attn = attn.transpose(1, 2).reshape({B, L, -1});
    h = clamp_fp16(h + b.o.forward(attn));
    // Feed-forward.
    x = t5_layer_norm(h, b.ln_ff.get(), c.layer_norm_eps);
    at::Tensor ff = hf_activation(b.wi_0.forward(x), c.act);
    if (c.gated) ff = ff * b.wi_1.forward(x);
    const auto wo_type = b.wo.weight().get().scalar_type();
    if (ff.scalar_type() != wo_type) ff = ff.to(wo_type);
    h = clamp_fp16(h + b.wo.forward(ff));
    record(fmt::format("block_output.{}", i), h);
    if (i + 1 < w.blocks.size()) record(fmt::format("hidden_states.{}", i + 1), h);
  }
  h = t5_layer_norm(h, w.final_ln.get(), c.layer_norm_eps);
  record(fmt::format("hidden_states.{}", w.blocks.size()), h);
  return h;
}

TensorMap T5Encoder::forward(const TensorMap& inputs, Trace* trace) const {
  auto it = inputs.find("input_ids");
  if (it == inputs.end()) throw RequestError(fmt::format("{}: input 'input_ids' is missing", config_.cls), true);
  auto mask = inputs.find("attention_mask");
  return {{"last_hidden_state", encode(it->second, mask == inputs.end() ? at::Tensor() : mask->second, trace)}};
}

TensorMap T5Encoder::example_inputs(uint64_t seed) const {
  // Seeded token ids of the config's vocabulary: batch 2 x 16 tokens; UMT5 (as
  // WanPipeline calls it) with an attention_mask, the second prompt right-padded.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  TensorMap in{{"input_ids", at::randint(config_.vocab_size, {2, 16}, gen, i64)}};
  if (config_.bias_per_block) {
    at::Tensor mask = at::ones({2, 16}, i64);
    mask[1].narrow(0, 11, 5).fill_(0);
    in["attention_mask"] = mask;
  }
  return in;
}

TPRUN_REGISTER_MODEL(T5Encoder, T5Config);
TPRUN_REGISTER_MODEL_AS(T5Encoder::kUmt5Class, T5Encoder, T5Config);

}  // namespace tprun::models
