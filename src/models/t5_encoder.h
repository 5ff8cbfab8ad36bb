#pragma once
// transformers' T5EncoderModel (FLUX.1's text_encoder_2) and UMT5EncoderModel
// (Wan's text_encoder) forward, tensor-parallel: one implementation, the
// config's model_type ("t5" / "umt5") choosing the variant.
//
// As T5Stack (transformers 4.57.6) runs the encoder without attention_mask
// (UMT5Stack, transformers 5.17, with one: padded keys get finfo(dtype).min
// added to their scores, as the eager attention adds create_bidirectional_mask's):
// embeddings = shared[input_ids]; per block
//   h = h + o(attn(layer_norm(h)))           T5 attention: NO 1/sqrt(d) scale,
//                                            scores + position_bias, softmax
//                                            in fp32
//   h = h + wo(act(wi_0(ln(h))) * wi_1(ln(h)))  gated ("gated-gelu": gelu_new)
//   h = h + wo(act(wi(ln(h))))                  non-gated ("relu", "gelu", ..)
// then final_layer_norm. T5 layer norm: RMS in fp32 without mean or bias,
// cast to the weight dtype when that is fp16 / bf16, then weight * x.
// position_bias [1, H, L, L] comes from block 0's relative_attention_bias at
// the (bidirectional, log-spaced) bucket of key - query position and is
// reused by every block. UMT5 differs only there: every block has its own
// relative_attention_bias (UMT5Attention(has_relative_attention_bias=True) in
// each layer), so each block computes its own position bias from the same
// buckets. Only shared.weight is saved for the tied embeddings (both classes'
// _tied_weights_keys map encoder.embed_tokens.weight to it).
//
// Tensor parallelism (t5_tp_plan): rank r of p holds heads [r H/p, (r+1) H/p)
// of q/k/v (colwise) and the matching input columns of o (rowwise), and d_ff/p
// rows of wi_0/wi_1 (or wi) with the matching columns of wo. One AllReduce
// closes attention (o) and one the feed-forward (wo): 2 per block when p > 1,
// none at p = 1. relative_attention_bias [buckets, H] is tiny: every rank
// loads it whole (replicated in the table); T5 computes the full position
// bias once, then takes its heads' slice (dim 1); UMT5 computes each block's
// bias from its heads' columns of that block's table only. shared.weight and
// the norms are replicated, so outputs are identical on every rank.
//
// Half precision, as transformers: with fp16, wo stays fp32
// (T5PreTrainedModel._keep_in_fp32_modules; not for bf16), its input is cast
// to fp32 and the residual stream becomes fp32 from there on (the next norm
// casts back to fp16). Hidden states that are fp16 are clamped after the
// attention and feed-forward sublayers as T5Block does (to +-(65504 - 1000)
// when any value is inf, else +-65504).

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class TensorCensus;  // models/model_config.h

// T5Config / UMT5Config fields, with transformers' defaults for those a saved
// config omits (UMT5Config's differ: vocab 250112, d_ff 1024, 8 layers, 6
// heads, "gated-gelu"). The activation comes from feed_forward_proj
// ("gated-ACT" or "ACT"; "gated-gelu" means gelu_new), as T5Config does; a
// stored dense_act_fn is ignored like there. model_type "t5" (the default) or
// "umt5"; "architectures": ["UMT5EncoderModel"] requires "umt5" (its default)
// and any other architecture "t5". CheckpointError naming the file and field.
struct T5Config {
  int64_t vocab_size = 32128, d_model = 512, d_kv = 64, d_ff = 2048, layers = 6, heads = 8;
  int64_t num_buckets = 32, max_distance = 128;
  double layer_norm_eps = 1e-6;
  std::string act = "relu";
  bool gated = false;
  // UMT5: a relative_attention_bias in every block (model_type "umt5").
  bool bias_per_block = false;
  std::string cls = "T5EncoderModel";  // the class, for the table and messages
  int64_t inner() const { return heads * d_kv; }
  static T5Config from_json(const nlohmann::json& config, const std::string& config_path,
                            const TensorCensus* census = nullptr);
};

// T5Attention._relative_position_bucket on an int64 tensor of key - query
// positions: int64 buckets in [0, num_buckets), with transformers' fp32 log.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional,
                                       int64_t num_buckets, int64_t max_distance);

struct T5Weights;  // t5_encoder.cpp

class T5Encoder final : public Model {
 public:
  static constexpr const char* kClass = "T5EncoderModel";
  static constexpr const char* kUmt5Class = "UMT5EncoderModel";  // registered too (model_type "umt5")
  // Patterns of the modules the diffusers / transformers class keeps in the
  // compute dtype when weights are stored narrower (its
  // _skip_layerwise_casting_patterns / _keep_in_fp32_modules).
  static std::vector<std::string> class_skip_patterns() { return {"wo"}; }

  // The table (plan applied): shared.weight [vocab, d_model]
  // (encoder.embed_tokens.weight, the same tied tensor, optional), per block
  // q/k/v [H*d_kv, d_model] colwise, o [d_model, H*d_kv] rowwise,
  // relative_attention_bias [buckets, H] in block 0 only (UMT5: in every
  // block, replicated), the layer norms,
  // wi_0/wi_1 (or wi) [d_ff, d_model] colwise, wo [d_model, d_ff] rowwise
  // (kept in fp32 when options.dtype is fp16); encoder.final_layer_norm. tp must
  // divide num_heads.
  static ModelTable table_for(const T5Config& config, const ModelOptions& options = {});

  // Validates the plan before reading any weight (tp divides num_heads,
  // every tensor present with the table's shape, split dims divide by tp),
  // then loads this rank's slices.
  static std::unique_ptr<T5Encoder> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                         const std::string& config_path, const parallel::TpContext& tp,
                                         const ModelOptions& options = {});

  // input_ids int64 [B, S] -> last_hidden_state [B, S, d_model] (after
  // final_layer_norm) in the compute dtype; identical on every rank of the TP
  // group. attention_mask [B, S] of 0/1 (undefined: every token attends; the
  // padded positions' own outputs are computed too, as transformers does).
  // RequestError (raised alike on every rank) for bad ids or mask.
  // Trace: "hidden_states.0" (embeddings), "relative_position_bucket" [L, L],
  // "position_bias" [1, H, L, L] (T5: all heads; UMT5: "position_bias.i", block
  // i's, this rank's heads), "block_output.i",
  // "hidden_states.i" (0 < i < layers: output of block i-1),
  // "hidden_states.<layers>" (final_layer_norm output).
  at::Tensor encode(const at::Tensor& input_ids, Trace* trace = nullptr) const;
  at::Tensor encode(const at::Tensor& input_ids, const at::Tensor& attention_mask, Trace* trace = nullptr) const;

  // {"input_ids", optional "attention_mask" (UMT5: example_inputs gives one,
  // so forward takes it)} -> {"last_hidden_state"}.
  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const override;
  TensorMap example_inputs(uint64_t seed) const override;
  std::string primary_output() const override { return "last_hidden_state"; }
  // 2 per block when tp > 1 (attention o, feed-forward wo), 0 at tp 1.
  int64_t all_reduces_per_forward() const override;

  int64_t d_model() const { return config_.d_model; }
  const T5Config& config() const { return config_; }

 private:
  T5Config config_;
  std::shared_ptr<const T5Weights> w_;
};

}  // namespace tprun::models
