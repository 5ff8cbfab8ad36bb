// T5EncoderModel: config, plan validation, loading this rank's slices and the
// tensor-parallel forward (see t5_encoder.h for the plan and the numerics).
#include "models/t5_encoder.h"

#include <cmath>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/clamp_max.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/log.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "dist/communicator.h"
#include "models/flux_transformer.h"  // validate_tp_plan (generic over ModelTable)
#include "parallel/parallel_linear.h"
#include "runtime/error.h"

namespace tprun::models {

T5Config T5Config::from_json(const nlohmann::json& c, const std::string& path) {
  T5Config f;
  auto get = [&](const char* field, int64_t& v) { v = config_positive(c, field, path, v); };
  get("vocab_size", f.vocab_size);
  get("d_model", f.d_model);
  get("d_kv", f.d_kv);
  get("d_ff", f.d_ff);
  get("num_layers", f.layers);
  get("num_heads", f.heads);
  get("relative_attention_num_buckets", f.num_buckets);
  get("relative_attention_max_distance", f.max_distance);
  if (f.num_buckets < 4) {
    throw CheckpointError(fmt::format("{}: field 'relative_attention_num_buckets' must be at least 4 for a "
                                      "bidirectional encoder, got {}",
                                      path, f.num_buckets));
  }
  f.layer_norm_eps = config_number_or(c, "layer_norm_epsilon", path, f.layer_norm_eps);
  // T5Config: "gated-ACT" or "ACT"; "gated-gelu" stands for gelu_new.
  const std::string proj = config_string_or(c, "feed_forward_proj", path, "relu");
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
  const std::string type = config_string_or(c, "model_type", path, "t5");
  if (type != "t5") {
    throw CheckpointError(fmt::format("{}: model_type '{}' is not a T5 encoder (expected 't5')", path, type));
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
  at::Tensor ln_attn, ln_ff;                  // [d_model]
  parallel::ParallelLinear q, k, v, o;       // colwise x3, rowwise
  parallel::ParallelLinear wi_0, wi_1, wo;   // colwise (wi_0 is `wi` when not gated), rowwise
};

struct T5Weights {
  at::Tensor shared;         // [vocab, d_model], replicated
  at::Tensor relative_bias;  // [buckets, H], whole on every rank
  std::vector<T5BlockWeights> blocks;
  at::Tensor final_ln;
};

T5Encoder T5Encoder::load(checkpoint::WeightSource& source, const nlohmann::json& config,
                          const std::string& config_path, const parallel::TpContext& tp,
                          const TextEncoderLoadOptions& options) {
  T5Encoder m;
  m.config_ = T5Config::from_json(config, config_path);
  m.tp_ = tp;
  const ModelTable table = t5_encoder_table(m.config_);
  // Before any weight byte: tp divides num_heads, shapes, split dims.
  validate_tp_plan(table, source, tp.size);
  parallel::check_tp_context(tp);

  checkpoint::LoadOptions lopts{options.mode, options.device, options.dtype};
  checkpoint::ShardLoader loader(source, lopts);
  // transformers keeps DenseReluDense.wo in fp32 when the model is fp16.
  const bool wo_fp32 =
      !options.dtype.empty() && checkpoint::parse_compute_dtype(options.dtype, "dtype") == at::kHalf;
  checkpoint::LoadOptions wo_opts = lopts;
  if (wo_fp32) wo_opts.dtype = "fp32";
  checkpoint::ShardLoader wo_loader(source, wo_opts);

  const uint64_t before = loader.bytes_read();
  auto tensor = [&](const std::string& name) { return loader.load(name, table.request(name, tp.rank, tp.size)); };
  auto linear = [&](checkpoint::ShardLoader& l, const std::string& prefix) {
    return parallel::ParallelLinear::load(l, prefix, table.request(prefix + ".weight", tp.rank, tp.size), false, {});
  };
  auto w = std::make_shared<T5Weights>();
  w->shared = tensor("shared.weight");
  for (int64_t i = 0; i < m.config_.layers; ++i) {
    const std::string p = fmt::format("encoder.block.{}.layer.", i);
    T5BlockWeights b;
    b.q = linear(loader, p + "0.SelfAttention.q");
    b.k = linear(loader, p + "0.SelfAttention.k");
    b.v = linear(loader, p + "0.SelfAttention.v");
    b.o = linear(loader, p + "0.SelfAttention.o");
    if (i == 0) w->relative_bias = tensor(p + "0.SelfAttention.relative_attention_bias.weight");
    b.ln_attn = tensor(p + "0.layer_norm.weight");
    if (m.config_.gated) {
      b.wi_0 = linear(loader, p + "1.DenseReluDense.wi_0");
      b.wi_1 = linear(loader, p + "1.DenseReluDense.wi_1");
    } else {
      b.wi_0 = linear(loader, p + "1.DenseReluDense.wi");
    }
    b.wo = linear(wo_loader, p + "1.DenseReluDense.wo");
    b.ln_ff = tensor(p + "1.layer_norm.weight");
    w->blocks.push_back(std::move(b));
  }
  w->final_ln = tensor("encoder.final_layer_norm.weight");
  source.close();
  m.bytes_loaded_ = loader.bytes_read() - before;
  m.w_ = std::move(w);
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

// Sums a rowwise layer's partial output over the TP group (no call at tp 1).
at::Tensor reduce(const parallel::TpContext& tp, const at::Tensor& partial) {
  if (tp.size == 1) return partial;
  if (!tp.comm) throw Error(Error::Kind::Internal, "tp > 1 without a communicator");
  at::Tensor buf = partial.contiguous();
  tp.comm->all_reduce(buf);
  return buf;
}

}  // namespace

at::Tensor T5Encoder::forward(const at::Tensor& input_ids, Trace* trace) const {
  const T5Weights& w = *w_;
  const T5Config& c = config_;
  auto record = [&](const std::string& name, const at::Tensor& t) {
    if (trace) trace->emplace_back(name, t);
  };
  at::Tensor ids = checked_input_ids(input_ids, c.vocab_size, "T5EncoderModel", true).to(w.shared.device());
  const int64_t B = ids.size(0), L = ids.size(1);
  const int64_t local_heads = c.heads / tp_.size;

  at::Tensor h = at::embedding(w.shared, ids);
  record("hidden_states.0", h);
  // Block 0's relative position bias, shared by every block: [1, H, L, L].
  at::Tensor position = at::arange(L, ids.options());
  at::Tensor bucket = t5_relative_position_bucket(position.unsqueeze(0) - position.unsqueeze(1), /*bidirectional=*/true,
                                                  c.num_buckets, c.max_distance);
  record("relative_position_bucket", bucket);
  at::Tensor bias = at::embedding(w.relative_bias, bucket).permute({2, 0, 1}).unsqueeze(0);
  record("position_bias", bias);
  if (tp_.size > 1) bias = bias.narrow(1, tp_.rank * local_heads, local_heads);  // this rank's heads

  auto split_heads = [&](const at::Tensor& y) { return y.view({B, L, -1, c.d_kv}).transpose(1, 2); };
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    const T5BlockWeights& b = w.blocks[i];
    // Self-attention, this rank's heads; no 1/sqrt(d) scaling in T5.
    at::Tensor x = t5_layer_norm(h, b.ln_attn, c.layer_norm_eps);
    at::Tensor q = split_heads(b.q.forward(x)), k = split_heads(b.k.forward(x)), v = split_heads(b.v.forward(x));
    at::Tensor scores = at::matmul(q, k.transpose(3, 2)) + bias;
    at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(scores.scalar_type());
    at::Tensor attn = at::matmul(probs, v).transpose(1, 2).reshape({B, L, -1});
    h = clamp_fp16(h + reduce(tp_, b.o.forward(attn)));
    // Feed-forward.
    x = t5_layer_norm(h, b.ln_ff, c.layer_norm_eps);
    at::Tensor ff = hf_activation(b.wi_0.forward(x), c.act);
    if (c.gated) ff = ff * b.wi_1.forward(x);
    const auto wo_type = b.wo.weights().weight->scalar_type();
    if (ff.scalar_type() != wo_type) ff = ff.to(wo_type);
    h = clamp_fp16(h + reduce(tp_, b.wo.forward(ff)));
    record(fmt::format("block_output.{}", i), h);
    if (i + 1 < w.blocks.size()) record(fmt::format("hidden_states.{}", i + 1), h);
  }
  h = t5_layer_norm(h, w.final_ln, c.layer_norm_eps);
  record(fmt::format("hidden_states.{}", w.blocks.size()), h);
  return h;
}

}  // namespace tprun::models
