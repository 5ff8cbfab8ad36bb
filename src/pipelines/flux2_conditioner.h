#pragma once
// The FLUX.2 pipelines' text conditioning (text_conditioner.h): the prompt in
// the text encoder's chat template (klein: Qwen3's, user message, generation
// prompt, thinking off; dev: Mistral's with the FLUX.2 system message),
// padded to max_sequence_length, the hidden states of the stacked layers
// (klein 9, 18, 27; dev 10, 20, 30) -> prompt_embeds [1, S, 3 x hidden]; a
// batch stacks them as encoder_hidden_states.

#include <cstdint>
#include <string>
#include <vector>

#include "pipelines/decoder_llm_conditioner.h"

namespace tprun::pipelines {

struct PromptTokens;

class Flux2Conditioner final : public DecoderLlmConditioner {
 public:
  // The tokenizer's chat template must be the one the pipeline renders with
  // (CheckpointError naming the tokenizer folder otherwise), with a pad token
  // and its ids inside the text encoder's vocabulary.
  Flux2Conditioner(const ComponentConfigs& configs, bool klein, int64_t joint_dim, c10::Device device,
                   c10::ScalarType dtype);

  models::TensorMap encode(const std::string& prompt, int64_t max_sequence_length) const override;
  void warn_truncation(const GenerationRequest& request, const char* field, int64_t max_sequence_length,
                       const models::TensorMap& encoded, bool leader) const override;
  models::TensorMap batch(const std::vector<models::TensorMap>& per_request, const std::string& prefix) const override;

  // The text encoder's hidden layers each pipeline stacks (text_encoder_out_layers).
  static std::vector<int64_t> stacked_layers(bool klein);
  // `tprun tokenize`: the chat-templated prompt padded to max_sequence_length.
  static std::vector<PromptTokens> tokenize(const std::string& folder, const std::string& prompt,
                                            int64_t max_sequence_length);

 private:
  bool klein_;
};

}  // namespace tprun::pipelines
