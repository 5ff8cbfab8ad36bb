#pragma once
// How a pipeline family turns prompts into the transformer's text inputs: the
// strategy the generate skeleton (diffusion_pipeline.h) calls, one per family:
//   ClipT5Conditioner        CLIP pooled + T5 hidden states (FluxPipeline)
//   ChatLlmConditioner       a decoder LLM over a chat template, hidden
//                            layers stacked (Flux2Pipeline, Flux2KleinPipeline)
//   QwenImageConditioner     Qwen's template, its first tokens dropped, a
//                            batch padded with a mask (QwenImagePipeline)
// A conditioner owns its text encoders and tokenizers (null where the load
// did not hold them) and encodes one prompt at a time; the skeleton caches,
// takes given tensors instead, warns about truncation and batches.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "models/tensor_map.h"
#include "pipelines/generation_request.h"

namespace tprun::models {
class Model;
}

namespace tprun::pipelines {

class LoadedComponents;

// A tensor one prompt's encode gives, which a request may give instead
// (GenerationRequest::given; "negative_" + name for the negative prompt).
struct TextTensor {
  std::string name;            // encode's and the request's name ("prompt_embeds")
  std::vector<int64_t> shape;  // -1: any size from 1 (need_given_shape)
  std::string meaning;         // for messages: "[1, text tokens, joint_attention_dim]"
  // Optional: a mask a request may give with the first tensor ([1, its text
  // tokens]); encodes never give one (all tokens real).
  bool mask = false;
};

class TextConditioner {
 public:
  virtual ~TextConditioner() = default;

  // "its text encoder" / "its text encoders", for messages.
  virtual std::string encoders_name() const = 0;
  // Whether this rank holds the text encoders (PipelineOptions::text_encoders).
  virtual bool loaded() const = 0;
  // What one encode gives, the required tensors first (the first is the
  // sequence the transformer attends to), then optional masks.
  virtual const std::vector<TextTensor>& tensors() const = 0;
  // One prompt, uncached: tensors() by name on the pipeline's device in its
  // dtype, plus the truncation counts (note_tokens_cut) its warnings read.
  virtual models::TensorMap encode(const std::string& prompt, int64_t max_sequence_length) const = 0;
  // diffusers' truncation warnings for the text `field` of `request`
  // (defaults applied) from its encode (or a staged encode's carried map).
  virtual void warn_truncation(const GenerationRequest& request, const char* field, int64_t max_sequence_length,
                               const models::TensorMap& encoded, bool leader) const = 0;
  // What a staged encode carries besides tensors() (FLUX.1: CLIP's limit
  // for its warning, where the encode-phase tokenizer is not loaded).
  virtual void add_carried(models::TensorMap& encoded) const {}
  // The batch's text inputs of the transformer from each request's tensors
  // (by tensors()' names, given or encoded; masks where given); `prefix`
  // ("" or "negative_") names them in messages ("negative_prompt_embeds").
  virtual models::TensorMap batch(const std::vector<models::TensorMap>& per_request,
                                  const std::string& prefix) const = 0;
  // Takes its text encoders from a load's components (none where the load
  // held no text encoders).
  virtual void take(LoadedComponents& parts) = 0;
  // The text encoders LoRA adapters reach as diffusers' load_lora_weights
  // does for the family (FluxPipeline: CLIP as "text_encoder"), by component
  // name, where loaded; and the key prefixes the family's loader drops (FLUX.1:
  // its T5's). Default: none (the family's adapters reach the transformer only).
  virtual std::vector<std::pair<std::string, const models::Model*>> lora_encoders() const { return {}; }
  virtual std::vector<std::string> lora_dropped_prefixes() const { return {}; }
};

}  // namespace tprun::pipelines
