#pragma once
// FluxPipeline's text conditioning (text_conditioner.h): CLIP's pooled output
// (tokenizer/, padded to its 77 ids) -> pooled_prompt_embeds [1, pooled] and
// T5's last hidden state (tokenizer_2/, max_sequence_length ids) ->
// prompt_embeds [1, S, joint]; a batch stacks them as the transformer's
// encoder_hidden_states and pooled_projections. Truncation warnings as
// _get_clip_prompt_embeds / _get_t5_prompt_embeds give them.

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
class ClipTextModel;
class T5Encoder;
}  // namespace tprun::models
namespace tprun::text {
class ClipTokenizer;
class T5Tokenizer;
}  // namespace tprun::text

namespace tprun::pipelines {

struct PromptTokens;

class ClipT5Conditioner final : public TextConditioner {
 public:
  // The tokenizers are read when `load_tokenizers` (the text encoders are loaded).
  ClipT5Conditioner(const checkpoint::PipelineFolder& pf, bool load_tokenizers, int64_t joint_dim, int64_t pooled_dim,
                    c10::Device device, c10::ScalarType dtype);
  ~ClipT5Conditioner() override;

  std::string encoders_name() const override { return "its text encoders"; }
  bool loaded() const override;
  const std::vector<TextTensor>& tensors() const override { return tensors_; }
  models::TensorMap encode(const std::string& prompt, int64_t max_sequence_length) const override;
  void warn_truncation(const GenerationRequest& request, const char* field, int64_t max_sequence_length,
                       const models::TensorMap& encoded, bool leader) const override;
  void add_carried(models::TensorMap& encoded) const override;
  models::TensorMap batch(const std::vector<models::TensorMap>& per_request, const std::string& prefix) const override;
  void take(LoadedComponents& parts) override;
  // CLIP ("text_encoder"); T5's keys are dropped, as diffusers' FluxPipeline drops them.
  std::vector<std::pair<std::string, const models::Model*>> lora_encoders() const override;
  std::vector<std::string> lora_dropped_prefixes() const override;

  // `tprun tokenize`: CLIP padded to its model_max_length, T5 to max_sequence_length.
  static std::vector<PromptTokens> tokenize(const std::string& folder, const std::string& prompt,
                                            int64_t max_sequence_length);

 private:
  std::vector<TextTensor> tensors_;
  c10::Device device_;
  c10::ScalarType dtype_;
  std::unique_ptr<text::ClipTokenizer> tokenizer_;
  std::unique_ptr<text::T5Tokenizer> tokenizer_2_;
  std::unique_ptr<models::ClipTextModel> clip_;
  std::unique_ptr<models::T5Encoder> t5_;
};

}  // namespace tprun::pipelines
