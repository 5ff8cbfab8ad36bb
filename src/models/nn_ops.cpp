#include "models/nn_ops.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/stack.h>

#include "parallel/matmul_trace.h"

namespace tprun::models::nn {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
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

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t tp_share) {
  const int64_t batch = q.size(0) * q.size(1), s_q = q.size(2), s_k = k.size(2), d = q.size(3);
  parallel::MatmulRecorder::record({batch, s_q, d, s_k, false, tp_share});  // Q K^T
  parallel::MatmulRecorder::record({batch, s_q, s_k, v.size(3), false, tp_share});  // P V
  return at::scaled_dot_product_attention(q, k, v);
}

}  // namespace tprun::models::nn
