// The FLUX.2 pipelines' text conditioning (see flux2_conditioner.h).
#include "pipelines/flux2_conditioner.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "models/decoder_text_encoder.h"
#include "pipelines/batch_stages.h"
#include "pipelines/component_configs.h"
#include "pipelines/pipeline.h"
#include "runtime/error.h"
#include "text/chat_template.h"
#include "text/hf_tokenizer.h"

namespace tprun::pipelines {
namespace {

constexpr const char* kKleinClass = "Flux2KleinPipeline";

// The template the pipeline's caller reads must be the one its text encoder
// was trained with: a Qwen3 template in a dev folder (or Mistral's in klein)
// would fail or mis-render every request, so it is a folder error at load.
void check_template_kind(const text::HfTokenizer& tok, bool klein, const std::string& cls) {
  const text::ChatTemplateKind want = klein ? text::ChatTemplateKind::kQwen3 : text::ChatTemplateKind::kMistral3;
  const text::ChatTemplateKind got = tok.chat_template(klein ? text::ChatCaller::kTokenizer : text::ChatCaller::kProcessor);
  if (got != want) {
    throw CheckpointError(fmt::format("{}: the chat template is {}'s; a {} renders its prompts with the {} template "
                                      "(the tokenizer folder belongs to another pipeline)",
                                      tok.folder(), text::chat_template_name(got), cls, text::chat_template_name(want)),
                          true);
  }
}

text::ChatRequest chat(bool klein, const std::string& prompt) {
  return klein ? text::flux2_klein_chat(prompt) : text::flux2_dev_chat(prompt);
}

}  // namespace

std::vector<int64_t> Flux2Conditioner::stacked_layers(bool klein) {
  return klein ? std::vector<int64_t>{9, 18, 27} : std::vector<int64_t>{10, 20, 30};
}

Flux2Conditioner::Flux2Conditioner(const ComponentConfigs& configs, bool klein, int64_t joint_dim, c10::Device device,
                                   c10::ScalarType dtype)
    : DecoderLlmConditioner(configs, {{"prompt_embeds", {1, -1, joint_dim}, "[1, text tokens, joint_attention_dim]"}},
                            device, dtype),
      klein_(klein) {
  if (!tokenizer_) return;
  const ComponentConfig& te = configs.at("text_encoder");
  check_template_kind(*tokenizer_, klein_, configs.cls());
  tokenizer_->require_pad_token(configs.cls());
  tokenizer_->check_ids_below(models::DecoderConfig::from_json(te.json, te.path).vocab_size, te.path);
}

models::TensorMap Flux2Conditioner::encode(const std::string& prompt, int64_t max_sequence_length) const {
  text::decode_utf8(prompt, "prompt");  // offsets of bad bytes in the user's prompt, not in the templated text
  const text::TokenizerOutput tokens = tokenizer_->encode_chat(chat(klein_, prompt), max_sequence_length);
  const Ids in = to_device(tokens.input_ids, tokens.attention_mask);
  models::TensorMap out;
  out["prompt_embeds"] = encoder_->stacked_hidden_states(in.ids, in.mask).to(dtype_);
  note_tokens_cut(out, "tokens_cut", tokens.untruncated_length, max_sequence_length);
  return out;
}

void Flux2Conditioner::warn_truncation(const GenerationRequest& q, const char* field, int64_t max_sequence_length,
                                       const models::TensorMap& e, bool leader) const {
  warn_max_sequence_truncated(q, field, max_sequence_length, e, "tokens_cut", leader);
}

models::TensorMap Flux2Conditioner::batch(const std::vector<models::TensorMap>& per_request,
                                          const std::string& prefix) const {
  models::TensorMap in;
  in["encoder_hidden_states"] = stack_text(per_request, "prompt_embeds", prefix);
  return in;
}

std::vector<PromptTokens> Flux2Conditioner::tokenize(const std::string& folder, const std::string& prompt,
                                                     int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const bool klein = pf.cls == kKleinClass;
  const text::HfTokenizer tokenizer = load_tokenizer(pf);
  check_template_kind(tokenizer, klein, pf.cls);
  tokenizer.require_pad_token(pf.cls);
  text::decode_utf8(prompt, "prompt");  // offsets of bad bytes in the user's prompt, not in the templated text
  return {{"tokenizer", klein ? "Qwen3 chat template" : "Mistral chat template with the FLUX.2 system message",
           tokenizer.encode_chat(chat(klein, prompt), max_sequence_length)}};
}

}  // namespace tprun::pipelines
