#pragma once
// The decoder-only text encoders of the FLUX.2 and Qwen-Image pipelines,
// tensor-parallel: one implementation, parameterised by config, of
//   transformers' Qwen3ForCausalLM              (FLUX.2 [klein]: Qwen3-4B / 8B)
//   the language model of Mistral3ForConditionalGeneration
//                                               (FLUX.2 [dev]: Mistral-Small-3.x-24B)
//   the language model of Qwen2_5_VLForConditionalGeneration
//                                               (Qwen-Image: Qwen2.5-VL-7B, 28 x 3584)
// run as the pipelines run them: input_ids and a padding attention_mask in,
// output.hidden_states[k] for the layers asked for out (no lm_head, no cache).
//
// Per layer (transformers 5.17 with its default sdpa attention, as the
// diffusers pipelines load them; Mistral and Qwen2.5-VL = Qwen3 without q/k norm):
//   x = rms(h, input_layernorm)
//   q = q_proj(x) -> [B, S, H, D] (-> rms(q, q_norm) on D: Qwen3) -> [B, H, S, D]
//   k = k_proj(x) -> [B, S, KV, D] (-> rms(k, k_norm): Qwen3), v = v_proj(x)
//   q, k = q cos + rotate_half(q) sin, positions 0..S-1 (whatever the padding)
//   k, v repeated to H heads (q head i uses kv head i / (H / KV))
//   a = sdpa(q, k, v, mask, scale D^-0.5)                      -> o_proj
//   h = h + a;  h = h + down_proj(act(gate_proj(y)) * up_proj(y)), y = rms(h, post_attention_layernorm)
// mask (sdpa_mask): key j visible to query i where j <= i, attention_mask[b, j]
// == 1 and (sliding window w) j > i - w; a query that sees no key (left
// padding) attends to nothing and gets 0, as torch's SDPA gives it. RMSNorm (Qwen3RMSNorm / MistralRMSNorm /
// Qwen2_5_VLRMSNorm): weight * (x_fp32 * rsqrt(mean(x_fp32^2) + eps)).to(x.dtype). RoPE cos / sin are computed
// in fp32 as the rotary embedding class does (rope_type default | linear |
// llama3 | yarn, attention_scaling applied), then cast to the compute dtype.
//
// Qwen2.5-VL's multimodal RoPE: the rotary class takes positions [3, B, S]
// (temporal, height, width), computes cos / sin for each row and builds the
// D/2 frequency columns from consecutive sections (mrope_section, summing to
// D/2): section i from row i % 3, then duplicates them (cat(f, f)). Text-only
// input (input_ids + attention_mask, no image grid) never reaches
// get_rope_index: Qwen2_5_VLModel leaves position_ids None and the text model
// uses arange(S) for every row of the batch and all three rows, padding or
// not. Three equal rows make the section pick the identity, so the tables are
// those of ordinary RoPE over 0..S-1, bitwise (each entry is the same fp32
// product inv_freq[j] * s). mrope_section is still checked (it must sum to
// D/2, or transformers' split fails).
//
// Hidden states, numbered as transformers' output.hidden_states: 0 = the
// embeddings, k = the output of layer k-1, and the last one (k = num_layers)
// AFTER the final norm (capture_outputs ties hidden_states[-1] to
// last_hidden_state). ModelOptions::hidden_layers picks the ones returned;
// layers after the largest one asked for are neither loaded nor run (the
// final norm only when k = num_layers is asked for); the table still declares
// every layer (those after the cut as optional in table_for). No
// hidden_layers: every layer and the final norm.
//
// Tensor parallelism (transformers' base_model_tp_plan of Qwen3Config /
// MistralConfig / Qwen2_5_VLTextConfig): q_proj, k_proj, v_proj, gate_proj, up_proj colwise;
// o_proj, down_proj rowwise (q/k/v biases -- Qwen3's attention_bias,
// always in Qwen2.5-VL -- split with their rows; Qwen3's o_proj bias added once
// after the reduce; Qwen2.5-VL's o_proj has none). Rank r of p holds query
// heads [r H/p, (r+1) H/p) and KV heads [r KV/p, (r+1) KV/p), so the local
// q -> kv mapping is the global one. Embeddings, every norm replicated.
// 2 AllReduces per layer run (o_proj, down_proj), none at tp 1. tp must
// divide num_attention_heads and num_key_value_heads (and intermediate_size).
//
// Tensor names. Qwen3ForCausalLM: model.embed_tokens, model.layers.N.*,
// model.norm, lm_head (never read; absent when tied). Mistral3 and
// Qwen2.5-VL: the language model, the vision tower (and Mistral3's projector)
// in one of two layouts:
//   saved      Mistral3:   language_model.model.*, language_model.lm_head,
//                          vision_tower.*, multi_modal_projector.*
//              Qwen2.5-VL: model.*, lm_head, visual.* (the hub's files)
//              (what save_pretrained writes: transformers 4.x and 5.17 alike
//              revert their key mapping when saving)
//   in-memory  Mistral3:   model.language_model.*, lm_head, model.vision_tower.*,
//                          model.multi_modal_projector.*
//              Qwen2.5-VL: model.language_model.*, lm_head, model.visual.*
//              (the module names; a state_dict written with safetensors
//              directly; transformers' conversion mapping loads both)
// The table built from the config alone (inspect, init-model) uses the saved
// layout; load() reads the checkpoint's tensor NAMES (headers only) and
// records the table in the layout the checkpoint has. The vision tower,
// projector and lm_head are declared (ModelBuilder::unused, shapes from
// vision_config) so every tensor of the folder is known, and never read.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class TensorCensus;  // models/model_config.h

// RoPE parameters as transformers 5 standardizes them: `rope_parameters`, or
// an older config's `rope_scaling` (+ `rope_theta`).
struct RopeParams {
  std::string type = "default";  // default | linear | llama3 | yarn
  double theta = 10000.0;
  std::optional<double> factor;  // linear, llama3, yarn (yarn: null -> max / original)
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;          // llama3, yarn
  std::optional<double> attention_factor, mscale, mscale_all_dim;  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;                         // yarn
  bool truncate = true;                                             // yarn
  // Qwen2.5-VL: the multimodal RoPE sections (temporal, height, width), summing
  // to head_dim / 2; empty for the other classes.
  std::vector<int64_t> mrope_section;
};

// The names and shapes of the parts of a Mistral3 checkpoint tprun never
// reads (Pixtral vision tower, multi-modal projector), from the config.
struct Mistral3VisionConfig {
  int64_t hidden = 1024, intermediate = 4096, layers = 24, channels = 3, patch_h = 14, patch_w = 14;
  int64_t feature_layers = 1;  // len(vision_feature_layer) when a list
  int64_t spatial_merge = 2;
  bool projector_bias = false;
};

// The names and shapes of Qwen2.5-VL's vision tower (never read), from
// vision_config (Qwen2_5_VLVisionConfig's defaults).
struct Qwen2_5_VLVisionConfig {
  int64_t depth = 32, hidden = 3584, intermediate = 3420, channels = 3, patch = 14, temporal_patch = 2;
  int64_t spatial_merge = 2, out_hidden = 3584;
};

enum class DecoderFamily { Qwen3, Mistral3, Qwen2_5_VL };
// Mistral3 / Qwen2.5-VL tensor names (see the header comment).
enum class NameLayout { Saved, InMemory };

struct DecoderConfig {
  DecoderFamily family = DecoderFamily::Qwen3;
  std::string cls;  // "Qwen3ForCausalLM" | "Mistral3ForConditionalGeneration" | "Qwen2_5_VLForConditionalGeneration"
  int64_t vocab_size = 151936, hidden_size = 4096, intermediate_size = 22016;
  int64_t layers = 32, heads = 32, kv_heads = 32, head_dim = 128;
  int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;
  std::string act = "silu";
  bool attention_bias = false;  // q/k/v biases: Qwen3's attention_bias, always in Qwen2.5-VL, never in Mistral
  bool o_proj_bias = false;     // Qwen3's attention_bias only
  bool qk_norm = true;          // Qwen3
  bool tie_word_embeddings = false;  // lm_head tied to embed_tokens (then save_pretrained does not write it)
  // Per layer: the sliding window (0 = full attention). Qwen3: layer_types /
  // use_sliding_window / max_window_layers; Mistral: sliding_window on every layer.
  std::vector<int64_t> window;
  RopeParams rope;
  // Mistral3 and Qwen2.5-VL: the name layout, and the vision tower's shapes.
  NameLayout layout = NameLayout::Saved;
  Mistral3VisionConfig vision;
  Qwen2_5_VLVisionConfig qwen_vision;

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  // Prefix of the language model's tensors ("model.", "language_model.model.",
  // "model.language_model.").
  std::string base_prefix() const;

  // The class from architectures[0] (or model_type); Mistral3's language
  // model from text_config, with Mistral3Config's / MistralConfig's defaults
  // for what is absent; Qwen2.5-VL's from text_config when it is an object
  // (transformers 5's file) else from the top-level fields (the hub's
  // transformers 4.x file), with Qwen2_5_VLTextConfig's defaults.
  // Every value checked and bounded (CheckpointError naming the file and
  // field; ConfigError for a rope_type tprun does not run).
  // decoder_text_encoder_config.cpp.
  static DecoderConfig from_json(const nlohmann::json& config, const std::string& config_path,
                                 const TensorCensus* census = nullptr);
};

struct DecoderWeights;  // decoder_text_encoder.cpp

class DecoderTextEncoder final : public Model {
 public:
  // The table (no checkpoint read): every layer, the final norm, and the
  // tensors never read (lm_head; the vision towers, Mistral3's projector) as
  // unused; with options.hidden_layers the layers after the cut (and the
  // final norm when the cut skips it) are optional too, as that load never
  // reads them. ConfigError for a hidden layer outside [0, num_hidden_layers].
  static ModelTable table_for(const DecoderConfig& config, const ModelOptions& options = {});

  // Mistral3, Qwen2.5-VL: picks the layout from the checkpoint's tensor names. Then
  // validates before any weight byte (tp divides num_attention_heads and
  // num_key_value_heads, every wanted tensor present with its shape) and
  // loads this rank's slices of the embeddings and of the layers up to the
  // last hidden state asked for (ModelOptions::hidden_layers).
  static std::unique_ptr<DecoderTextEncoder> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                  const std::string& config_path, const parallel::TpContext& tp,
                                                  const ModelOptions& options = {});

  // The hidden states asked for (ModelOptions::hidden_layers, in that order;
  // none asked for: {last_hidden_state}), each [B, S, hidden_size] in the
  // compute dtype, identical on every rank of the TP group. input_ids: int
  // [B, S]; attention_mask: [B, S] of 0/1 (undefined: all ones). RequestError
  // (alike on every rank) for bad ids or mask. Trace: "hidden_states.0",
  // "layers.{i}.attention", "hidden_states.{i+1}" per layer run ("hidden_states.<L>"
  // after the final norm).
  std::vector<at::Tensor> hidden_states(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                        Trace* trace = nullptr) const;
  // What the FLUX.2 pipelines feed the transformer:
  //   stack([hidden_states[k] for k in hidden_layers], dim=1).permute(0, 2, 1, 3)
  //       .reshape(B, S, n * hidden_size)
  // i.e. [B, S, n * hidden_size], token s holding hidden_states[k_0][s], hidden_states[k_1][s], ...
  at::Tensor stacked_hidden_states(const at::Tensor& input_ids, const at::Tensor& attention_mask) const;

  // {"input_ids", optional "attention_mask"} -> with hidden_layers:
  // {"hidden_states.<k>" for each k, "prompt_embeds"}; without:
  // {"last_hidden_state"} (after the final norm).
  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const override;
  // Seeded ids of the vocabulary, batch 2 x 16; attention_mask with the
  // second row right-padded (11 tokens).
  TensorMap example_inputs(uint64_t seed) const override;
  std::string primary_output() const override;
  // 2 per layer run when tp > 1 (o_proj, down_proj), 0 at tp 1.
  int64_t all_reduces_per_forward() const override;

  const DecoderConfig& config() const { return config_; }
  // The hidden_states indices this model returns (empty: last_hidden_state).
  const std::vector<int64_t>& hidden_layers() const { return hidden_layers_; }
  // Decoder layers loaded and run.
  int64_t layers_run() const { return layers_run_; }
  int64_t hidden_size() const { return config_.hidden_size; }

 private:
  DecoderConfig config_;
  std::vector<int64_t> hidden_layers_;
  int64_t layers_run_ = 0;
  bool final_norm_ = true;
  int64_t attention_chunk_ = 0;  // MemoryOptions::attention_chunk
  std::shared_ptr<const DecoderWeights> w_;
};

}  // namespace tprun::models
