#pragma once
// What the text conditioners over one decoder-only language model share
// (text_conditioner.h): the model_index.json `tokenizer` (a tokenizer.json
// tokenizer of the class model_index.json names, with a pad token and ids
// inside the encoder's vocabulary, checked before any weight is read) and the
// `text_encoder` (DecoderTextEncoder, split over the TP group or whole). The
// families' conditioners (Flux2Conditioner, QwenImageConditioner) say how a
// prompt becomes ids and which hidden states they read.

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
class DecoderTextEncoder;
}
namespace tprun::text {
class HfTokenizer;
}

namespace tprun::pipelines {

class ComponentConfigs;

class DecoderLlmConditioner : public TextConditioner {
 public:
  ~DecoderLlmConditioner() override;

  std::string encoders_name() const override { return "its text encoder"; }
  bool loaded() const override { return encoder_ != nullptr; }
  const std::vector<TextTensor>& tensors() const override { return tensors_; }
  void take(LoadedComponents& parts) override;

  // The folder's tokenizer as the pipeline reads it (model_index.json's class).
  static text::HfTokenizer load_tokenizer(const checkpoint::PipelineFolder& pf);

 protected:
  // `configs` with the text encoder's config where the text encoders are loaded;
  // then the tokenizer is read and checked against it.
  DecoderLlmConditioner(const ComponentConfigs& configs, std::vector<TextTensor> tensors, c10::Device device,
                        c10::ScalarType dtype);
  // One prompt's ids [1, S] and mask on the device.
  struct Ids {
    at::Tensor ids, mask;
  };
  Ids to_device(const std::vector<int64_t>& ids, const std::vector<int64_t>& mask) const;

  std::vector<TextTensor> tensors_;
  c10::Device device_;
  c10::ScalarType dtype_;
  std::unique_ptr<text::HfTokenizer> tokenizer_;
  std::unique_ptr<models::DecoderTextEncoder> encoder_;
};

}  // namespace tprun::pipelines
