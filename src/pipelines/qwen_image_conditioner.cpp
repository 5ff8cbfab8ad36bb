// QwenImagePipeline's text conditioning (see qwen_image_conditioner.h).
#include "pipelines/qwen_image_conditioner.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "models/decoder_text_encoder.h"
#include "pipelines/batch_stages.h"
#include "pipelines/component_configs.h"
#include "pipelines/pipeline.h"
#include "pipelines/qwen_image_defaults.h"
#include "pipelines/qwen_image_text.h"
#include "runtime/error.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_batch.h"

namespace tprun::pipelines {
namespace {

// The pipeline's tokenizer call for one prompt: the template, tokenizer([text],
// max_length=1024 + 34, padding=True, truncation=True) (one prompt is never padded).
text::TokenizerBatch qwen_image_tokens(const text::HfTokenizer& tokenizer, const std::string& prompt) {
  return text::encode_batch_longest(tokenizer, {qwen_image_prompt_text(prompt)},
                                    kQwenImageTokenizerMax + kQwenImageDropTokens);
}

}  // namespace

QwenImageConditioner::QwenImageConditioner(const ComponentConfigs& configs, int64_t joint_dim, c10::Device device,
                                           c10::ScalarType dtype)
    : DecoderLlmConditioner(configs,
                            {{"prompt_embeds", {1, -1, joint_dim}, "[1, text tokens, joint_attention_dim]"},
                             {"prompt_embeds_mask", {}, "", true}},
                            device, dtype) {
  if (!tokenizer_) return;
  for (const char* special : {"<|im_start|>", "<|im_end|>"}) {
    if (!tokenizer_->token_id(special)) {
      throw CheckpointError(fmt::format("{}: the tokenizer has no '{}' token; the QwenImagePipeline's prompt "
                                        "template needs it (the folder belongs to another pipeline)",
                                        tokenizer_->folder(), special),
                            true);
    }
  }
  const ComponentConfig& te = configs.at("text_encoder");
  tokenizer_->require_pad_token(configs.cls());
  tokenizer_->check_ids_below(models::DecoderConfig::from_json(te.json, te.path).vocab_size, te.path);
}

models::TensorMap QwenImageConditioner::encode(const std::string& prompt, int64_t max_sequence_length) const {
  text::decode_utf8(prompt, "prompt");  // offsets of bad bytes in the user's prompt, not in the templated text
  const text::TokenizerBatch tokens = qwen_image_tokens(*tokenizer_, prompt);
  const int64_t untruncated = tokens.untruncated_lengths.front();
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor id_tensor = at::tensor(tokens.input_ids.front(), long_opts).view({1, -1}).to(device_);
  const at::Tensor mask = at::ones_like(id_tensor);
  const at::Tensor hidden = encoder_->hidden_states(id_tensor, mask).front();
  models::TensorMap out;
  out["prompt_embeds"] = qwen_image_keep_tokens(hidden, kQwenImageDropTokens, max_sequence_length).to(dtype_);
  note_tokens_cut(out, "tokens_cut", untruncated - kQwenImageDropTokens, max_sequence_length);
  return out;
}

void QwenImageConditioner::warn_truncation(const GenerationRequest& q, const char* field, int64_t max_sequence_length,
                                           const models::TensorMap& e, bool leader) const {
  warn_truncated(q, field,
                 fmt::format("`max_sequence_length` is set to {} tokens (after the template's {})",
                             max_sequence_length, kQwenImageDropTokens),
                 tokens_cut(e, "tokens_cut"), leader);
}

models::TensorMap QwenImageConditioner::batch(const std::vector<models::TensorMap>& per_request,
                                              const std::string& prefix) const {
  std::vector<at::Tensor> embeds, masks;
  for (const auto& m : per_request) {
    embeds.push_back(m.at("prompt_embeds"));
    const auto mask = m.find("prompt_embeds_mask");
    masks.push_back(mask != m.end() ? mask->second : at::Tensor());
  }
  const TextBatch text = pad_text_batch(embeds, masks, (prefix + "prompt_embeds").c_str());
  models::TensorMap in;
  in["encoder_hidden_states"] = text.embeds;
  if (text.mask.defined()) in["encoder_hidden_states_mask"] = text.mask;
  return in;
}

std::vector<PromptTokens> QwenImageConditioner::tokenize(const std::string& folder, const std::string& prompt,
                                                         int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const text::HfTokenizer tokenizer = load_tokenizer(pf);
  tokenizer.require_pad_token(pf.cls);
  text::decode_utf8(prompt, "prompt");
  text::TokenizerBatch tokens = qwen_image_tokens(tokenizer, prompt);
  std::vector<int64_t> ids = std::move(tokens.input_ids.front());
  text::TokenizerOutput out;
  out.untruncated_length = tokens.untruncated_lengths.front();
  // What reaches the transformer: after the dropped tokens, at most max_sequence_length.
  out.attention_mask.assign(ids.size(), 0);
  for (size_t i = static_cast<size_t>(kQwenImageDropTokens);
       i < ids.size() && i < static_cast<size_t>(kQwenImageDropTokens + max_sequence_length); ++i) {
    out.attention_mask[i] = 1;
  }
  out.input_ids = std::move(ids);
  return {{"tokenizer",
           fmt::format("Qwen-Image prompt template (mask: the tokens that reach the transformer, after the first {})",
                       kQwenImageDropTokens),
           std::move(out)}};
}

}  // namespace tprun::pipelines
