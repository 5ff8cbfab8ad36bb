#pragma once
// WanPipeline's text conditioning (text_conditioner.h), as diffusers 0.40's
// WanPipeline._get_t5_prompt_embeds computes it for one prompt:
//   prompt_clean(prompt)                  text/wan_prompt_clean.h (no ftfy)
//   tokenizer(..., padding="max_length", max_length=max_sequence_length,
//             truncation=True, add_special_tokens=True)   tokenizer/ (UMT5,
//                                          text/t5_unigram_tokenizer.h)
//   UMT5EncoderModel(ids, mask).last_hidden_state, cut to the prompt's
//   tokens (mask.sum()) and zero-padded back to max_sequence_length
// -> prompt_embeds [1, max_sequence_length, text_dim]; a batch stacks them as
// the transformer's encoder_hidden_states (no mask: the zeros are attended
// to, as diffusers does). The encoder runs on the prompt's own tokens only:
// the padded keys are masked out of every real row's attention (their
// weights are exactly 0) and the padded rows are replaced by zeros, so the
// result is diffusers' up to float summation order.
// Truncation: diffusers' WanPipeline cuts a long prompt at max_sequence_length
// silently; tprun logs its usual truncation warning (tokens cut, request id).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "pipelines/text_conditioner.h"

namespace tprun::checkpoint {
struct PipelineFolder;
}
namespace tprun::models {
class T5Encoder;
}
namespace tprun::text {
class T5UnigramTokenizer;
}

namespace tprun::pipelines {

struct PromptTokens;

class WanConditioner final : public TextConditioner {
 public:
  // `text_dim`: the transformer's text_dim (= the UMT5 encoder's d_model).
  // The tokenizer (tokenizer/) is read when `load_tokenizers` (the text
  // encoder is loaded); then its length is checked against
  // text_encoder/config.json's vocab_size (CheckpointError naming both).
  WanConditioner(const checkpoint::PipelineFolder& pf, bool load_tokenizers, int64_t text_dim, c10::Device device,
                 c10::ScalarType dtype);
  ~WanConditioner() override;

  std::string encoders_name() const override { return "its text encoder"; }
  bool loaded() const override;
  const std::vector<TextTensor>& tensors() const override { return tensors_; }
  // {"prompt_embeds" [1, max_sequence_length, text_dim] in the pipeline's
  // dtype, "tokens_cut"}.
  models::TensorMap encode(const std::string& prompt, int64_t max_sequence_length) const override;
  void warn_truncation(const GenerationRequest& request, const char* field, int64_t max_sequence_length,
                       const models::TensorMap& encoded, bool leader) const override;
  // {"encoder_hidden_states": the prompts' prompt_embeds stacked [B, S, text_dim]}.
  models::TensorMap batch(const std::vector<models::TensorMap>& per_request, const std::string& prefix) const override;
  // Takes "text_encoder" (a UMT5EncoderModel, models::T5Encoder).
  void take(LoadedComponents& parts) override;

  // `tprun tokenize`: tokenizer/'s ids for prompt_clean(prompt), padded to
  // max_sequence_length, as the pipeline passes them to its text encoder.
  static std::vector<PromptTokens> tokenize(const std::string& folder, const std::string& prompt,
                                            int64_t max_sequence_length);

 private:
  std::vector<TextTensor> tensors_;
  c10::Device device_;
  c10::ScalarType dtype_;
  std::unique_ptr<text::T5UnigramTokenizer> tokenizer_;
  std::unique_ptr<models::T5Encoder> umt5_;
};

}  // namespace tprun::pipelines
