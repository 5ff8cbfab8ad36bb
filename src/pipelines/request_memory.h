#pragma once
// Will a batch of requests fit in this rank's memory? An estimate of the
// peak a batch adds on top of the weights a rank already holds, from the
// model's shapes and the request's size, checked before any compute against
// what the rank may still allocate (runtime/host_memory.h), identically on
// every rank of a TP group; and allocation failures that still happen turned
// into request errors. docs/memory.md "Memory per request".
//
// The estimate, per rank (elem = the compute dtype's bytes, S = image +
// text tokens, B = batch, D = heads x head_dim, tp = the TP group size):
//   step      one denoising step: B x S x elem x (6 D + (3 D + 2 D fp32 rope
//             + D + mlp_in + mlp_hidden + D + mlp_hidden) / tp)
//   attention the scores B x heads/tp x rows x S x elem x 3 where the
//             backend materialises them (math), rows = attention_chunk or S;
//             the flash kernels' per-thread blocks otherwise
//   text      the text encoder over the prompt (eager scores included)
//   decode    the VAE decoder of one image (the ranks that decode): 3.5 live
//             activations of the widest level, level by level, at full size,
//             or of one tile with vae_tiling; its mid-block attention as above.
//             A result of F frames: the activations of the frames one latent
//             frame decodes to (min(F, temporal_scale): a video VAE
//             decodes a latent frame at a time), the decoded copies and
//             blended tiles of all F frames; an image (F = 1) as before
//   peak      = kept (latents, embeddings) + max(text, step + attention,
//             decode), x 1.15 for allocator slack, + 64 MiB
// Calibrated against measured peaks (docs/memory.md "Memory per request").

#include <cstdint>
#include <string>
#include <vector>

#include "models/vae.h"
#include "parallel/tp_context.h"
#include "pipelines/generation_request.h"


namespace tprun::pipelines {

class Pipeline;

struct TransformerShape {
  int64_t heads = 0, head_dim = 0;
  int64_t mlp_in = 0;      // width of the MLP's input projection (SwiGLU: 2 x mlp_hidden)
  int64_t mlp_hidden = 0;  // width after the activation
  int64_t in_channels = 0; // packed latent channels
  int64_t joint_dim = 0;   // text embedding width the transformer takes
  int64_t inner() const { return heads * head_dim; }
};

// The VAE decoder's shape for the estimate (models/vae.h).
using VaeShape = models::VaeShape;

struct MemoryModel {
  std::string pipeline;         // "FluxPipeline", for messages
  TransformerShape transformer;
  int64_t tp_size = 1;
  int64_t elem_bytes = 4;       // compute dtype
  bool scores_materialised = false;  // the transformer's attention backend builds the scores
  std::string attention_backend;     // for messages
  int64_t attention_chunk = 0;  // [memory] attention_chunk (0 = one call)
  int64_t text_hidden = 0;      // text encoder width; 0 = no text encoder on this rank
  bool decodes = false;         // this rank holds the VAE and decodes
  VaeShape vae;
  uint64_t weights_bytes = 0;   // held by this rank (for messages)
  int64_t threads = 1;
};

struct RequestShape {
  int64_t batch = 1;
  int64_t height = 0, width = 0;
  int64_t frames = 1;        // F of each result (an image: 1)
  int64_t image_tokens = 0;  // the latents' tokens (every latent frame's)
  int64_t text_tokens = 0;
  bool encodes_text = true;  // prompts to encode (no prompt_embeds given)
};

struct MemoryEstimate {
  uint64_t kept = 0, text = 0, step = 0, attention = 0, decode = 0;
  uint64_t peak = 0;  // see the header comment
  // "VAE decode" | "denoising step" | "text encoder": the largest stage.
  std::string largest() const;
};

// Computed in floating point and saturated: a size whose bytes pass 2^64 gives
// UINT64_MAX, never a wrapped small number.
MemoryEstimate estimate_request_memory(const MemoryModel& model, const RequestShape& shape);

// Byte counts that saturate at UINT64_MAX instead of wrapping, for sums and
// products of estimates (the fit planner's phases).
inline uint64_t add_bytes(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}
inline uint64_t mul_bytes(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

// What every family fills alike: the compute dtype's bytes ("fp32" | "bf16" |
// "fp16"), the attention backend libtorch picks on `device` for the
// transformer's heads, this rank's threads, and the VAE's shape (null `vae`:
// this rank does not decode). model.transformer first.
void fill_runtime(MemoryModel& model, const std::string& device, const std::string& dtype, const VaeShape* vae);

// The shape of a prepared batch (prepare_batch): its size, its frames, the
// latent tokens of its requests (Pipeline::request_latent_shape), the text
// tokens (given prompt_embeds, else max_sequence_length).
RequestShape batch_shape(const Pipeline& pipeline, const std::vector<GenerationRequest>& prepared);

// The check before a batch runs: the estimate against this rank's available
// memory (device_memory(cuda_index); node-wide limits shared by the node's
// ranks), exchanged over the TP group so every rank of it decides alike.
// RequestError (raised alike on every rank of the group) naming both
// numbers, the limit and what to try when some rank cannot fit the batch.
// A rank whose limits cannot be read does not refuse. Skipped when the
// environment sets TPRUN_MEMORY_CHECK=0 (no collective then on any rank).
void check_batch_memory(const MemoryModel& model, const RequestShape& shape, const parallel::TpContext& tp,
                        const std::string& device);

// For a catch block around a batch's compute: rethrows the exception in
// flight, an allocation failure as a RequestError naming it and what to try
// (tp size 1: the batch fails and the job goes on) or, inside a TP group,
// as an error that ends the job (its peers may be waiting in a collective
// this rank will not join). Anything else unchanged.
[[noreturn]] void rethrow_generation_failure(const parallel::TpContext& tp);

}  // namespace tprun::pipelines
