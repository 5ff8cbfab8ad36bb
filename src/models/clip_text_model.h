#pragma once
// transformers' CLIPTextModel (FLUX.1's text_encoder) forward, replicated.
//
// As CLIPTextTransformer.forward (transformers 4.57.6, eager attention) calls
// it without attention_mask: token + position embeddings; per layer
//   h = h + out_proj(attn(layer_norm1(h)))   causal mask (finfo.min above the
//                                            diagonal), scale head_dim^-0.5,
//                                            softmax in fp32
//   h = h + fc2(act(fc1(layer_norm2(h))))    act = config "hidden_act"
// then final_layer_norm. Padding positions are not masked. Pooling: when the
// config's eos_token_id is 2 (openai's / FLUX.1's legacy value) the pooled row
// of sequence b is at argmax(input_ids[b]); otherwise at the first position
// where input_ids[b] == eos_token_id (0 when there is none, as argmax gives).
//
// Not tensor-parallel: the model is small next to the transformer and every
// rank loads it whole (the table has no plan).

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

// CLIPTextConfig fields, with transformers' defaults for those a saved config
// omits. CheckpointError naming the file and field.
struct ClipTextConfig {
  int64_t vocab_size = 49408, hidden_size = 512, intermediate_size = 2048;
  int64_t layers = 12, heads = 8, max_positions = 77;
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  int64_t eos_token_id = 49407;
  int64_t head_dim() const { return hidden_size / heads; }
  static ClipTextConfig from_json(const nlohmann::json& config, const std::string& config_path,
                                  const TensorCensus* census = nullptr);
};

struct ClipTextWeights;  // clip_text_model.cpp

class ClipTextModel final : public Model {
 public:
  static constexpr const char* kClass = "CLIPTextModel";

  // The table: every tensor under "text_model.", all replicated;
  // text_model.embeddings.position_ids [1, P] (a buffer older checkpoints
  // store) is optional. load() also reads checkpoints without the
  // "text_model." prefix (transformers 5's save_pretrained writes them so).
  static ModelTable table_for(const ClipTextConfig& config, const ModelOptions& options = {});

  // Validates the checkpoint against the table (every tensor present with the
  // table's shape) before reading any weight, then loads it whole (every rank
  // of a TP group holds the whole model: `tp` is not used).
  static std::unique_ptr<ClipTextModel> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                             const std::string& config_path, const parallel::TpContext& tp = {},
                                             const ModelOptions& options = {});

  // input_ids int64 [B, S] (S <= max_position_embeddings) ->
  // {"last_hidden_state" [B, S, H], "pooler_output" [B, H]} in the compute
  // dtype. RequestError for ids out of vocab, a wrong rank or S too long.
  // Trace: "hidden_states.0" (embeddings), "hidden_states.i" (output of layer
  // i-1, before final_layer_norm).
  TensorMap encode(const at::Tensor& input_ids, Trace* trace = nullptr) const;

  // {"input_ids"} -> encode().
  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const override;
  TensorMap example_inputs(uint64_t seed) const override;
  std::string primary_output() const override { return "last_hidden_state"; }

  int64_t hidden_size() const { return config_.hidden_size; }
  int64_t max_positions() const { return config_.max_positions; }
  const ClipTextConfig& config() const { return config_; }

 private:
  ClipTextConfig config_;
  std::shared_ptr<const ClipTextWeights> w_;
};

}  // namespace tprun::models
