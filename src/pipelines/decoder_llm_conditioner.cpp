// The text conditioners over one decoder LLM (see decoder_llm_conditioner.h).
#include "pipelines/decoder_llm_conditioner.h"

#include <ATen/ATen.h>

#include "checkpoint/pipeline_folder.h"
#include "models/decoder_text_encoder.h"
#include "pipelines/component_configs.h"
#include "pipelines/component_loader.h"
#include "text/hf_tokenizer.h"

namespace tprun::pipelines {

DecoderLlmConditioner::DecoderLlmConditioner(const ComponentConfigs& configs, std::vector<TextTensor> tensors,
                                             c10::Device device, c10::ScalarType dtype)
    : tensors_(std::move(tensors)), device_(device), dtype_(dtype) {
  if (!configs.text_encoders()) return;
  tokenizer_ = std::make_unique<text::HfTokenizer>(load_tokenizer(configs.folder()));
}

DecoderLlmConditioner::~DecoderLlmConditioner() = default;

text::HfTokenizer DecoderLlmConditioner::load_tokenizer(const checkpoint::PipelineFolder& pf) {
  // The tokenizer class model_index.json names (Qwen2TokenizerFast, PixtralProcessor) decides what is read.
  const auto& tok = need_component(pf, "tokenizer");
  return text::HfTokenizer::load(tok.path, tok.cls);
}

void DecoderLlmConditioner::take(LoadedComponents& parts) {
  encoder_ = parts.take<models::DecoderTextEncoder>("text_encoder");
}

DecoderLlmConditioner::Ids DecoderLlmConditioner::to_device(const std::vector<int64_t>& ids,
                                                            const std::vector<int64_t>& mask) const {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  Ids out;
  out.ids = at::tensor(ids, long_opts).view({1, -1}).to(device_);
  out.mask = at::tensor(mask, long_opts).view({1, -1}).to(device_);
  return out;
}

}  // namespace tprun::pipelines
