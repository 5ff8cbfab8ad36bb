#pragma once
// QwenImagePipeline's text conditioning (text_conditioner.h): the prompt in
// the pipeline's fixed template (qwen_image_defaults.h), tokenized and
// truncated to 1024 + 34 tokens, the encoder's last hidden state (after its
// final norm), the first 34 tokens dropped, then cut to max_sequence_length
// -> prompt_embeds [1, S, hidden]. A request may give prompt_embeds_mask
// with its embeddings. A batch pads its prompts' embeddings to the longest
// with zeros and passes the mask (1 = a real token) to the transformer; a
// batch whose prompts are all of one length passes none, as diffusers does.

#include <cstdint>
#include <string>
#include <vector>

#include "pipelines/decoder_llm_conditioner.h"

namespace tprun::pipelines {

struct PromptTokens;

class QwenImageConditioner final : public DecoderLlmConditioner {
 public:
  // The tokenizer must know the template's special tokens (CheckpointError
  // naming the tokenizer folder otherwise), have a pad token and ids inside
  // the text encoder's vocabulary.
  QwenImageConditioner(const ComponentConfigs& configs, int64_t joint_dim, c10::Device device, c10::ScalarType dtype);

  models::TensorMap encode(const std::string& prompt, int64_t max_sequence_length) const override;
  void warn_truncation(const GenerationRequest& request, const char* field, int64_t max_sequence_length,
                       const models::TensorMap& encoded, bool leader) const override;
  models::TensorMap batch(const std::vector<models::TensorMap>& per_request, const std::string& prefix) const override;

  // `tprun tokenize`: the templated prompt as the pipeline tokenizes it; the
  // mask marks the tokens that reach the transformer.
  static std::vector<PromptTokens> tokenize(const std::string& folder, const std::string& prompt,
                                            int64_t max_sequence_length);
};

}  // namespace tprun::pipelines
