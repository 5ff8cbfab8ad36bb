#pragma once
// The parameter-free building blocks of diffusion transformers, as plain
// functions over ATen (no torch::nn): norms, activations, the sinusoidal
// timestep embedding, rotary position embeddings and attention. Each states
// the diffusers / torch semantics it reproduces.

#include <cstdint>
#include <memory>
#include <vector>

namespace at {
class Tensor;
}

namespace tprun::models::nn {

// torch.nn.RMSNorm over the last dim (what diffusers' Flux attention uses):
// torch's own kernel, which for 16-bit inputs computes
// x * rsqrt(mean(x^2, -1) + eps) * weight in fp32 and casts back once.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// LayerNorm over the last dim without affine parameters.
at::Tensor layer_norm(const at::Tensor& x, double eps);

at::Tensor gelu_tanh(const at::Tensor& x);
at::Tensor silu(const at::Tensor& x);

// diffusers' get_timestep_embedding(t, dim, flip_sin_to_cos, shift, scale=1,
// max_period=10000) for 1-D t: [B] -> [B, dim] fp32.
// freq_i = exp(-ln(max_period) * i / (dim/2 - shift)); emb = [sin(t f), cos(t f)]
// ([cos, sin] when flip_sin_to_cos).
at::Tensor timestep_embedding(const at::Tensor& t, int64_t dim, bool flip_sin_to_cos, double shift);

// FluxPosEmbed: ids [S, n_axes] -> (cos, sin) [S, sum(axes_dims)] fp32. For
// axis i with dim d: freqs = 1 / theta^(2j/d), j < d/2 (fp64), angle =
// pos * freq; cos/sin repeated interleaved (c0 c0 c1 c1 ...).
struct Rope {
  std::shared_ptr<at::Tensor> cos;  // [S, D] fp32
  std::shared_ptr<at::Tensor> sin;
};
Rope rope_frequencies(const at::Tensor& ids, const std::vector<int64_t>& axes_dims, double theta);

// apply_rotary_emb (use_real, unbind dim -1) on x [B, H, S, D]: pairs
// (x_2j, x_2j+1) rotate; computed in fp32, cast back to x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const Rope& rope);

// Scaled dot-product attention over [B, H, S, D], scale 1/sqrt(D), no mask.
// `tp_share`: the TP group size when H is this rank's share of the heads
// (for parallel/matmul_trace.h's FLOP count).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t tp_share = 1);

}  // namespace tprun::models::nn
