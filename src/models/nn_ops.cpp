#include "models/nn_ops.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>

#include <ATen/SDPBackend.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "parallel/matmul_trace.h"
#include "runtime/error.h"

namespace tprun::models::nn {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

at::Tensor diffusers_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, true);
  at::Tensor r = x * at::rsqrt(variance + eps);  // fp32 (type promotion)
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) r = r.to(weight.scalar_type());
  return r * weight;
}

at::Tensor layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x, {x.size(-1)}, {}, {}, eps);
}

at::Tensor gelu_tanh(const at::Tensor& x) { return at::gelu(x, "tanh"); }
at::Tensor silu(const at::Tensor& x) { return at::silu(x); }

at::Tensor timestep_embedding(const at::Tensor& t, int64_t dim, bool flip_sin_to_cos, double shift) {
  const int64_t half = dim / 2;
  at::Tensor exponent = at::arange(0, half, t.options().dtype(at::kFloat)) * (-std::log(10000.0));
  exponent = exponent / (static_cast<double>(half) - shift);
  at::Tensor freqs = at::exp(exponent);
  at::Tensor angles = t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  at::Tensor s = at::sin(angles), c = at::cos(angles);
  at::Tensor emb = flip_sin_to_cos ? at::cat({c, s}, -1) : at::cat({s, c}, -1);
  if (dim % 2 == 1) emb = at::cat({emb, at::zeros({emb.size(0), 1}, emb.options())}, -1);
  return emb;
}

Rope rope_frequencies(const at::Tensor& ids, const std::vector<int64_t>& axes_dims, double theta) {
  at::Tensor pos = ids.to(at::kFloat);
  std::vector<at::Tensor> cos_parts, sin_parts;
  for (size_t i = 0; i < axes_dims.size(); ++i) {
    const int64_t d = axes_dims[i];
    auto f64 = pos.options().dtype(at::kDouble);
    at::Tensor j = at::arange(0, d, 2, f64).narrow(0, 0, d / 2);
    at::Tensor freqs = 1.0 / at::pow(theta, j / static_cast<double>(d));
    at::Tensor angles = at::outer(pos.select(1, static_cast<int64_t>(i)).to(at::kDouble), freqs);
    cos_parts.push_back(at::cos(angles).repeat_interleave(2, 1).to(at::kFloat));
    sin_parts.push_back(at::sin(angles).repeat_interleave(2, 1).to(at::kFloat));
  }
  Rope r;
  r.cos = std::make_shared<at::Tensor>(at::cat(cos_parts, -1));
  r.sin = std::make_shared<at::Tensor>(at::cat(sin_parts, -1));
  return r;
}

at::Tensor apply_rope(const at::Tensor& x, const Rope& rope) {
  // x: [B, H, S, D]; cos/sin: [S, D] broadcast over B and H.
  at::Tensor pairs = x.reshape({x.size(0), x.size(1), x.size(2), -1, 2});
  at::Tensor re = pairs.select(-1, 0), im = pairs.select(-1, 1);
  at::Tensor rotated = at::stack({-im, re}, -1).flatten(3);
  at::Tensor out = x.to(at::kFloat) * *rope.cos + rotated.to(at::kFloat) * *rope.sin;
  return out.to(x.scalar_type());
}

int64_t checked_attention_chunk(int64_t chunk) {
  if (chunk < 0 || chunk > kMaxAttentionChunk) {
    throw ConfigError(fmt::format("attention_chunk = {}: must be 0 (one attention call over all queries) or a "
                                  "number of query tokens per call in [1, {}]",
                                  chunk, kMaxAttentionChunk),
                      true);
  }
  return chunk;
}

namespace {

// An uninitialised tensor of `sizes` whose dims are laid out in memory in the
// order of `like`'s strides (outermost first), so that the joined output of
// the chunks has the layout one call would have given (SDPA kernels return
// [B, S, H, D] memory viewed as [B, H, S, D]).
at::Tensor empty_with_layout_of(const at::Tensor& like, const std::vector<int64_t>& sizes) {
  const auto n = static_cast<size_t>(like.dim());
  const auto strides = like.strides();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  std::vector<int64_t> stored(n), inverse(n);
  for (size_t i = 0; i < n; ++i) {
    stored[i] = sizes[static_cast<size_t>(order[i])];
    inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  }
  return at::empty(stored, like.options()).permute(inverse);
}

}  // namespace

at::Tensor over_query_chunks(int64_t s_q, int64_t chunk, int64_t dim,
                             const std::function<at::Tensor(int64_t start, int64_t length)>& fn) {
  if (chunk <= 0 || chunk >= s_q) return fn(0, s_q);
  at::Tensor first = fn(0, chunk);
  const int64_t d = dim < 0 ? dim + first.dim() : dim;
  std::vector<int64_t> sizes = first.sizes().vec();
  sizes.at(static_cast<size_t>(d)) = s_q;
  at::Tensor out = empty_with_layout_of(first, sizes);
  out.narrow(d, 0, chunk).copy_(first);
  first.reset();  // one chunk's output alive at a time besides the result
  for (int64_t start = chunk; start < s_q; start += chunk) {
    const int64_t n = std::min(chunk, s_q - start);
    out.narrow(d, start, n).copy_(fn(start, n));
  }
  return out;
}

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                std::optional<double> scale, int64_t chunk) {
  const int64_t s_q = q.size(-2);
  if (chunk <= 0 || chunk >= s_q) return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale);
  // A mask with a row per query goes with its queries; one that broadcasts over them (size 1) goes whole.
  const bool per_query = mask.has_value() && mask->defined() && mask->dim() >= 2 && mask->size(-2) == s_q;
  return over_query_chunks(s_q, chunk, -2, [&](int64_t start, int64_t n) {
    std::optional<at::Tensor> m = mask;
    if (per_query) m = mask->narrow(-2, start, n);
    return at::scaled_dot_product_attention(q.narrow(-2, start, n), k, v, m, 0.0, false, scale);
  });
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t tp_share,
                     int64_t chunk) {
  const int64_t batch = q.size(0) * q.size(1), s_q = q.size(2), s_k = k.size(2), d = q.size(3);
  parallel::MatmulRecorder::record({batch, s_q, d, s_k, false, tp_share});  // Q K^T
  parallel::MatmulRecorder::record({batch, s_q, s_k, v.size(3), false, tp_share});  // P V
  return sdpa(q, k, v, std::nullopt, std::nullopt, chunk);
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            int64_t tp_share, int64_t chunk) {
  const int64_t batch = q.size(0) * q.size(1), s_q = q.size(2), s_k = k.size(2), d = q.size(3);
  parallel::MatmulRecorder::record({batch, s_q, d, s_k, false, tp_share});  // Q K^T
  parallel::MatmulRecorder::record({batch, s_q, s_k, v.size(3), false, tp_share});  // P V
  return sdpa(q, k, v, mask, std::nullopt, chunk);
}

namespace {

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    default: return c10::toString(t);
  }
}

}  // namespace

std::string sdpa_backend(const std::string& device, c10::ScalarType dtype, int64_t heads, int64_t head_dim,
                         bool masked) {
  try {
    const c10::Device dev(device);
    const auto opts = at::TensorOptions().dtype(dtype).device(dev);
    constexpr int64_t probe = 16;  // tokens
    const at::Tensor x = at::zeros({1, std::max<int64_t>(heads, 1), probe, std::max<int64_t>(head_dim, 1)}, opts);
    std::optional<at::Tensor> mask;
    if (masked) mask = at::ones({1, 1, probe, probe}, opts.dtype(at::kBool));
    const int64_t choice = at::_fused_sdp_choice(x, x, x, mask);
    switch (static_cast<at::SDPBackend>(choice)) {
      case at::SDPBackend::math: return "math kernel (materialises the scores)";
      case at::SDPBackend::flash_attention: return dev.is_cpu() ? "flash attention CPU kernel" : "flash attention";
      case at::SDPBackend::efficient_attention: return "memory-efficient attention";
      case at::SDPBackend::cudnn_attention: return "cuDNN attention";
      case at::SDPBackend::overrideable: return "the device's own (overrideable) kernel";
      default: return fmt::format("backend {}", choice);
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return fmt::format("backend unknown: {}", what.substr(0, what.find('\n')));
  }
}

std::string attention_chunk_phrase(int64_t chunk) {
  if (chunk <= 0) return "one call over all queries";
  return fmt::format("queries in chunks of {} token{}", chunk, chunk == 1 ? "" : "s");
}

void log_sdpa_attention(const std::string& model, const std::string& device, c10::ScalarType dtype, int64_t heads,
                        int64_t head_dim, bool masked, int64_t chunk) {
  spdlog::info("attention ({}): scaled_dot_product_attention (libtorch, {} for {} head_dim {}{} on {}), {}", model,
               sdpa_backend(device, dtype, heads, head_dim, masked), dtype_name(dtype), head_dim,
               masked ? " with a mask" : "", device, attention_chunk_phrase(chunk));
}

void log_eager_attention(const std::string& model, int64_t chunk) {
  spdlog::info("attention ({}): eager matmul + softmax (as transformers runs {}), {}", model, model,
               attention_chunk_phrase(chunk));
}

}  // namespace tprun::models::nn
