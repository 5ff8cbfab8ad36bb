// WanPipeline's text conditioning (see wan_conditioner.h).
#include "pipelines/wan_conditioner.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "models/t5_encoder.h"
#include "pipelines/batch_stages.h"
#include "pipelines/component_configs.h"
#include "pipelines/component_loader.h"
#include "pipelines/pipeline.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "text/t5_unigram_tokenizer.h"
#include "text/wan_prompt_clean.h"

namespace tprun::pipelines {

WanConditioner::WanConditioner(const checkpoint::PipelineFolder& pf, bool load_tokenizers, int64_t text_dim,
                               c10::Device device, c10::ScalarType dtype)
    : device_(device), dtype_(dtype) {
  tensors_ = {{"prompt_embeds", {1, -1, text_dim}, "[1, max_sequence_length, text_dim]"}};
  if (!load_tokenizers) return;
  tokenizer_ = std::make_unique<text::T5UnigramTokenizer>(need_component(pf, "tokenizer").path);
  const std::string config_path = need_component(pf, "text_encoder").path + "/config.json";
  const int64_t vocab = models::T5Config::from_json(read_json_file(config_path, "text encoder config"), config_path)
                            .vocab_size;
  if (tokenizer_->vocab_size() > vocab) {
    throw CheckpointError(fmt::format("{}: vocab_size {} is below the tokenizer's {} ids ({}/tokenizer/): its ids "
                                      "would fall outside the embedding",
                                      config_path, vocab, tokenizer_->vocab_size(), pf.path),
                          true);
  }
}

WanConditioner::~WanConditioner() = default;

bool WanConditioner::loaded() const { return umt5_ != nullptr; }

void WanConditioner::take(LoadedComponents& parts) {
  umt5_ = parts.take<models::T5Encoder>("text_encoder");
  const int64_t text_dim = tensors_.front().shape[2];
  if (umt5_ && umt5_->d_model() != text_dim) {
    throw CheckpointError(fmt::format("text_encoder/config.json: d_model {} differs from the transformer's text_dim {}",
                                      umt5_->d_model(), text_dim),
                          true);
  }
}

models::TensorMap WanConditioner::encode(const std::string& prompt, int64_t max_sequence_length) const {
  const text::TokenizerOutput tokens = tokenizer_->encode(text::wan_prompt_clean(prompt), max_sequence_length);
  int64_t used = 0;  // mask.gt(0).sum(): the prompt's tokens, eos included
  for (int64_t m : tokens.attention_mask) used += m;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const std::vector<int64_t> own(tokens.input_ids.begin(), tokens.input_ids.begin() + used);
  const at::Tensor ids = at::tensor(own, long_opts).view({1, -1}).to(device_);
  // Every token of `ids` is real: no mask needed (an all-ones mask adds nothing).
  const at::Tensor hidden = umt5_->encode(ids).to(dtype_);  // [1, used, d_model]
  at::Tensor embeds = at::zeros({1, max_sequence_length, hidden.size(2)}, hidden.options());
  embeds.narrow(1, 0, used).copy_(hidden);
  models::TensorMap out;
  out["prompt_embeds"] = embeds;
  note_tokens_cut(out, "tokens_cut", tokens.untruncated_length, max_sequence_length);
  return out;
}

void WanConditioner::warn_truncation(const GenerationRequest& q, const char* field, int64_t max_sequence_length,
                                     const models::TensorMap& e, bool leader) const {
  warn_max_sequence_truncated(q, field, max_sequence_length, e, "tokens_cut", leader);
}

models::TensorMap WanConditioner::batch(const std::vector<models::TensorMap>& per_request,
                                        const std::string& prefix) const {
  models::TensorMap in;
  in["encoder_hidden_states"] = stack_text(per_request, "prompt_embeds", prefix);
  return in;
}

std::vector<PromptTokens> WanConditioner::tokenize(const std::string& folder, const std::string& prompt,
                                                   int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const text::T5UnigramTokenizer tokenizer(need_component(pf, "tokenizer").path);
  return {{"tokenizer", "UMT5 (prompt_clean applied)", tokenizer.encode(text::wan_prompt_clean(prompt),
                                                                        max_sequence_length)}};
}

}  // namespace tprun::pipelines
