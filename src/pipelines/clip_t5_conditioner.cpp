// FluxPipeline's text conditioning (see clip_t5_conditioner.h).
#include "pipelines/clip_t5_conditioner.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "models/clip_text_model.h"
#include "models/t5_encoder.h"
#include "pipelines/batch_stages.h"
#include "pipelines/component_configs.h"
#include "pipelines/component_loader.h"
#include "pipelines/pipeline.h"
#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"

namespace tprun::pipelines {

ClipT5Conditioner::ClipT5Conditioner(const checkpoint::PipelineFolder& pf, bool load_tokenizers, int64_t joint_dim,
                                     int64_t pooled_dim, c10::Device device, c10::ScalarType dtype)
    : device_(device), dtype_(dtype) {
  tensors_ = {{"prompt_embeds", {1, -1, joint_dim}, "[1, text tokens, joint_attention_dim]"},
              {"pooled_prompt_embeds", {1, pooled_dim}, "[1, pooled_projection_dim]"}};
  if (!load_tokenizers) return;
  tokenizer_ = std::make_unique<text::ClipTokenizer>(need_component(pf, "tokenizer").path);
  tokenizer_2_ = std::make_unique<text::T5Tokenizer>(need_component(pf, "tokenizer_2").path);
}

ClipT5Conditioner::~ClipT5Conditioner() = default;

bool ClipT5Conditioner::loaded() const { return clip_ && t5_; }

void ClipT5Conditioner::take(LoadedComponents& parts) {
  clip_ = parts.take<models::ClipTextModel>("text_encoder");
  t5_ = parts.take<models::T5Encoder>("text_encoder_2");
}

models::TensorMap ClipT5Conditioner::encode(const std::string& prompt, int64_t max_sequence_length) const {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const text::TokenizerOutput clip_tokens = tokenizer_->encode(prompt, tokenizer_->model_max_length());
  const text::TokenizerOutput t5_tokens = tokenizer_2_->encode(prompt, max_sequence_length);
  at::Tensor clip_ids = at::tensor(clip_tokens.input_ids, long_opts).view({1, -1}).to(device_);
  at::Tensor t5_ids = at::tensor(t5_tokens.input_ids, long_opts).view({1, -1}).to(device_);
  auto clip_out = clip_->encode(clip_ids);
  models::TensorMap out;
  out["pooled_prompt_embeds"] = clip_out.at("pooler_output").to(dtype_);
  out["prompt_embeds"] = t5_->encode(t5_ids).to(dtype_);
  note_tokens_cut(out, "clip_tokens_cut", clip_tokens.untruncated_length, tokenizer_->model_max_length());
  note_tokens_cut(out, "t5_tokens_cut", t5_tokens.untruncated_length, max_sequence_length);
  return out;
}

void ClipT5Conditioner::add_carried(models::TensorMap& out) const {
  // The CLIP limit its truncation warning names, for a pipeline without the tokenizer.
  if (out.count("clip_tokens_cut")) out["clip_max_length"] = at::scalar_tensor(tokenizer_->model_max_length(), at::kLong);
}

void ClipT5Conditioner::warn_truncation(const GenerationRequest& q, const char* field, int64_t max_sequence_length,
                                        const models::TensorMap& e, bool leader) const {
  warn_max_sequence_truncated(q, field, max_sequence_length, e, "t5_tokens_cut", leader);
  const int64_t clip_cut = tokens_cut(e, "clip_tokens_cut");
  if (clip_cut <= 0) return;
  const auto carried = e.find("clip_max_length");
  const int64_t clip_max = carried != e.end() ? carried->second.item<int64_t>()
                           : tokenizer_       ? tokenizer_->model_max_length()
                                              : 0;
  warn_truncated(q, field, fmt::format("CLIP can only handle sequences up to {} tokens", clip_max), clip_cut, leader);
}

models::TensorMap ClipT5Conditioner::batch(const std::vector<models::TensorMap>& per_request,
                                           const std::string& prefix) const {
  models::TensorMap in;
  in["encoder_hidden_states"] = stack_text(per_request, "prompt_embeds", prefix);
  in["pooled_projections"] = stack_text(per_request, "pooled_prompt_embeds", prefix);
  return in;
}

std::vector<PromptTokens> ClipT5Conditioner::tokenize(const std::string& folder, const std::string& prompt,
                                                      int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const text::ClipTokenizer clip(need_component(pf, "tokenizer").path);
  const text::T5Tokenizer t5(need_component(pf, "tokenizer_2").path);
  return {{"tokenizer", "CLIP", clip.encode(prompt, clip.model_max_length())},
          {"tokenizer_2", "T5", t5.encode(prompt, max_sequence_length)}};
}

std::vector<std::pair<std::string, const models::Model*>> ClipT5Conditioner::lora_encoders() const {
  if (!clip_) return {};
  return {{"text_encoder", clip_.get()}};
}

std::vector<std::string> ClipT5Conditioner::lora_dropped_prefixes() const {
  return {"lora_te2_", "text_encoders.t5xxl.", "text_encoder_2."};
}

}  // namespace tprun::pipelines
