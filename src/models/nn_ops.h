#pragma once
// The parameter-free building blocks of diffusion transformers, as plain
// functions over ATen (no torch::nn): norms, activations, the sinusoidal
// timestep embedding, rotary position embeddings and attention. Each states
// the diffusers / torch semantics it reproduces.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "memory/memory_options.h"

namespace at {
class Tensor;
}

namespace tprun::models::nn {

// torch.nn.RMSNorm over the last dim (what diffusers' Flux attention uses):
// torch's own kernel, which for 16-bit inputs computes
// x * rsqrt(mean(x^2, -1) + eps) * weight in fp32 and casts back once.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// diffusers' normalization.RMSNorm with a weight and no bias (what its
// shared Attention class uses for qk_norm "rms_norm", and Qwen-Image's
// txt_norm): r = x * rsqrt(mean(x^2 in fp32, -1) + eps) in fp32; a 16-bit
// weight first rounds r to the weight's dtype and multiplies in it (two
// roundings where torch's kernel above has one), an fp32 weight multiplies r.
at::Tensor diffusers_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

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

// ---- attention ----------------------------------------------------------
//
// Every attention of the models goes through libtorch's
// scaled_dot_product_attention (the text encoders T5 and CLIP through the
// eager matmul / softmax transformers runs for them), optionally with the
// queries in chunks (MemoryOptions::attention_chunk): chunk = N > 0 splits the
// queries into consecutive runs of at most N tokens along the sequence dim,
// each attending to all keys / values, and writes each run's output into its
// rows of the result. Softmax is per query row, so this is exact up to the
// floating-point order of the kernel; it bounds the activation memory of a
// backend that materialises the scores (math, or the eager text encoders) to
// N x S_k per head. chunk = 0 (or >= S_q): one call over all queries, the
// same call as without the option.

// The largest MemoryOptions::attention_chunk accepted.
constexpr int64_t kMaxAttentionChunk = memory::kMaxAttentionChunk;

// MemoryOptions::attention_chunk checked (the one place the models validate
// it): ConfigError (raised alike on every rank) for a value outside
// [0, kMaxAttentionChunk]. Returns it.
int64_t checked_attention_chunk(int64_t chunk);

// Runs fn(start, length) over consecutive query ranges of at most `chunk`
// rows covering [0, s_q) and returns their outputs joined along `dim` (each
// copied into its rows of one result laid out as the first chunk's output).
// chunk 0 or >= s_q: returns fn(0, s_q) itself.
at::Tensor over_query_chunks(int64_t s_q, int64_t chunk, int64_t dim,
                             const std::function<at::Tensor(int64_t start, int64_t length)>& fn);

// at::scaled_dot_product_attention(q, k, v, mask, 0, false, scale) over
// [..., S, D], the queries in chunks of `chunk` (see above); a mask whose
// query dim (-2) has S_q rows is sliced with them, one that broadcasts over
// the queries is passed whole. Records nothing.
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& mask = std::nullopt, std::optional<double> scale = std::nullopt,
                int64_t chunk = 0);

// Scaled dot-product attention over [B, H, S, D], scale 1/sqrt(D), no mask,
// the queries in chunks of `chunk` (0: one call).
// `tp_share`: the TP group size when H is this rank's share of the heads
// (for parallel/matmul_trace.h's FLOP count; recorded once for all chunks,
// so the totals do not depend on the chunk).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t tp_share = 1,
                     int64_t chunk = 0);

// attention() with a boolean key mask broadcast over heads and queries
// (true = attend), e.g. [B, 1, 1, S_k]: a key whose entry is false gets no
// weight (SDPA's boolean attn_mask). Same FLOP record and chunking.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            int64_t tp_share = 1, int64_t chunk = 0);

// The kernel libtorch's SDPA dispatches to for queries / keys of `head_dim`
// in `dtype` on `device` ("cpu", "cuda:0"), with a boolean mask when
// `masked`, as at::_fused_sdp_choice picks it for a small probe of `heads`
// x 16 tokens: "flash attention CPU kernel" (what libtorch runs on CPU for
// fp32 / bf16 / fp16, with or without a mask), "math kernel (materialises the
// scores)", and on CUDA "flash attention", "memory-efficient attention",
// "cuDNN attention"; "backend unknown: <why>" when the probe fails (no
// such device, ...).
std::string sdpa_backend(const std::string& device, c10::ScalarType dtype, int64_t heads, int64_t head_dim,
                         bool masked);

// "queries in chunks of N tokens" | "one call over all queries".
std::string attention_chunk_phrase(int64_t chunk);

// The load's info line (every rank; the logger prefixes the rank):
//   "attention (<model>): scaled_dot_product_attention (libtorch, <backend> for
//    <dtype> head_dim <D>[ with a mask] on <device>), queries in chunks of N
//    tokens" | "..., one call over all queries"
void log_sdpa_attention(const std::string& model, const std::string& device, c10::ScalarType dtype, int64_t heads,
                        int64_t head_dim, bool masked, int64_t chunk);
//   "attention (<model>): eager matmul + softmax (as transformers runs <model>), ..."
void log_eager_attention(const std::string& model, int64_t chunk);

}  // namespace tprun::models::nn
